"""`artmlx serve` as a real process: it answers, and Ctrl-C or SIGTERM stop it without an abort."""

import os
import signal
import subprocess
import sys
import time

import openai

from artmlx.netutil import free_port


def test_serve_answers_and_stops_cleanly_on_ctrl_c_and_sigterm():
    for stop in (signal.SIGINT, signal.SIGTERM):
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "artmlx", "serve", "--port", str(port)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=60)
            deadline = time.monotonic() + 120
            while True:
                try:
                    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                           max_tokens=3)
                    break
                except openai.APIConnectionError:
                    assert process.poll() is None and time.monotonic() < deadline, "the server did not come up"
                    time.sleep(0.5)
            assert reply.choices[0].finish_reason in ("stop", "length")
            process.send_signal(stop)
            output, _ = process.communicate(timeout=60)
        finally:
            process.kill()
        assert process.returncode == 0, (stop, output[-2000:])
        assert "terminate called" not in output and "Traceback" not in output and "server stopped" in output
