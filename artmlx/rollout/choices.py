"""ART trajectories as artmlx episodes: the exact tokens the server sampled, never re-tokenised text.

An ART `Trajectory` is `messages_and_choices`: message dicts (system, user, tool, or an assistant
message written by the program) and `Choice` objects returned by the chat API. Its episode is
one token sequence: the first choice's prompt, that choice's sampled tokens (trained: policy mask
on, with their sampler logprobs), then for each later choice the part of its prompt that follows
the sequence so far (the template's closing and the messages that came in between: not trained),
then its tokens, and so on. Messages after the last choice are not part of it.

A trajectory captured by openpipe-art 0.5.23's `art.trajectory(...)` carries `exchanges` instead: each
chat completions request the rollout made, with its response. Its turns are the responses' choices
in order (one choice each: with n > 1 which one the conversation continued is unknown), their
prompts the ids the server fed the model (the response's `prompt_token_ids`), else the request's
messages and tools rendered again.

Where a choice's numbers come from:
- tokens and logprobs: the choice's `token_ids` and `token_logprobs` (what `artmlx serve` attaches
  to every choice), else its `logprobs.content` entries in vLLM's `token_id:N` form (what ART's
  LocalBackend asks vLLM for);
- its prompt: the choice's `prompt_token_ids` (the ids the server fed the model), else rebuilt
  from the messages before it and the trajectory's tools with `ChatFormat.prompt_ids`, which is
  how `artmlx serve` builds every prompt.

A trajectory is refused (`TrajectoryRefused`, with the reason) when a choice has no token ids or
no logprobs, when an id is outside the vocabulary, when a choice was sampled at another temperature
than the learner's or with top_p, logit_bias or a penalty (`sampling_modified`, on the choice or
on its logprob entries, which is where a stream assembler keeps it: the importance ratios would
compare different distributions), when it has
`additional_histories`, or when a later prompt does not start with the sequence so far. The last
happens when the chat template renders an earlier reply differently from the tokens the model
sampled (tool-call JSON re-serialised, reasoning dropped): ART re-tokenises such turns in place;
artmlx trains a trajectory as the one sequence the model saw and refuses what is not one.

A directive hint (`set_directive_hint(trajectory, hint)`, or `metadata["directive_hint"]` set by hand)
becomes the episode's teacher prompt: the first reply's messages and tools, the hint appended to the last
user message (`hints.py`), rendered by the chat template (`learner/distill.py` trains on it).
"""

from __future__ import annotations

import math

from ..chat import ChatFormat
from ..hints import HINT_KEY, hinted_messages
from ..trajectory import Episode


class TrajectoryRefused(ValueError):
    """This trajectory cannot be trained token-exactly; the message says why and what to change."""


def is_choice(item) -> bool:
    return not isinstance(item, dict) and hasattr(item, "message")


def _extra(choice) -> dict:
    return dict(getattr(choice, "model_extra", None) or {})


def choice_tokens(choice, where: str) -> tuple[list[int], list[float]]:
    """The sampled ids and their sampler logprobs recorded in a chat completion choice."""
    extra = _extra(choice)
    entries = (getattr(choice.logprobs, "content", None) or []) if getattr(choice, "logprobs", None) else []
    tokens = extra.get("token_ids")
    if tokens is None and entries:
        try:
            tokens = [int(entry.token.removeprefix("token_id:")) for entry in entries]
        except ValueError:
            raise TrajectoryRefused(f"{where}: its logprob entries name tokens as text, not token_id:N; ask the "
                                    "server for return_tokens_as_token_ids (artmlx serve adds token_ids itself)") from None
    if not tokens:
        raise TrajectoryRefused(f"{where}: the choice carries no token ids; use a server that returns them "
                                "(artmlx serve, or vLLM with logprobs and return_tokens_as_token_ids)")
    logprobs = extra.get("token_logprobs")
    if logprobs is None and entries:
        logprobs = [entry.logprob for entry in entries]
    if logprobs is None:
        raise TrajectoryRefused(f"{where}: the choice carries no sampler logprobs; request logprobs=True")
    if len(logprobs) != len(tokens) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise TrajectoryRefused(f"{where}: {len(tokens)} token ids but {len(logprobs)} logprobs")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v <= 0 for v in logprobs):
        raise TrajectoryRefused(f"{where}: its logprobs must be finite and at most 0")
    return list(tokens), [float(v) for v in logprobs]


def _entries_modified(choice) -> list[str]:
    entries = (getattr(choice.logprobs, "content", None) or []) if getattr(choice, "logprobs", None) else []
    return sorted({name for entry in entries for name in (_extra(entry).get("sampling_modified") or [])})


def _entries_temperature(choice) -> float | None:
    """The temperature recorded on the logprob entries (what survives ART's stream assembler), if any."""
    entries = (getattr(choice.logprobs, "content", None) or []) if getattr(choice, "logprobs", None) else []
    used = {_extra(entry).get("sampling_temperature") for entry in entries} - {None}
    return max(used) if used else None


def messages_before(items: list) -> list[dict]:
    """The chat messages of `items`, each choice as the assistant message the API client resends
    (content and tool calls), as ART's `get_messages` writes them."""
    messages = []
    for item in items:
        if is_choice(item):
            message = {"role": "assistant", "content": item.message.content or ""}
            if item.message.tool_calls:
                message["tool_calls"] = [call.model_dump(mode="json") for call in item.message.tool_calls]
            messages.append(message)
        else:
            messages.append(dict(item))
    return messages


def _message_turns(trajectory, chat: ChatFormat) -> list[tuple[str, object, object]]:
    """(where, choice, a function giving its prompt ids if the choice does not carry them) per choice."""
    items = list(trajectory.messages_and_choices)
    tools = list(trajectory.tools) if getattr(trajectory, "tools", None) else None
    return [(f"messages_and_choices[{index}]", item,
             lambda index=index: chat.prompt_ids(messages_before(items[:index]), tools))
            for index, item in enumerate(items) if is_choice(item)]


def _exchange_turns(exchanges, chat: ChatFormat) -> list[tuple[str, object, object]]:
    others = [kind for kind in ("completions", "responses", "messages") if getattr(exchanges, kind, None)]
    if others:
        raise TrajectoryRefused(f"exchanges of {others}: artmlx trains chat completions exchanges only")
    turns = []
    for index, exchange in enumerate(exchanges.chat_completions):
        where = f"exchanges.chat_completions[{index}]"
        response, request = exchange.response, dict(exchange.request)
        if len(response.choices) != 1:
            raise TrajectoryRefused(f"{where}: {len(response.choices)} choices; which one the conversation "
                                    "continued is unknown: ask for n=1 inside a captured trajectory")
        choice = response.choices[0]
        prompt = _extra(response).get("prompt_token_ids")
        if prompt and not _extra(choice).get("prompt_token_ids"):
            choice = type(choice).model_validate({**choice.model_dump(), "prompt_token_ids": prompt})
        turns.append((where, choice, lambda request=request: chat.prompt_ids(
            messages_before(list(request.get("messages") or [])), request.get("tools") or None)))
    return turns


def trajectory_episode(trajectory, chat: ChatFormat, temperature: float, vocab_size: int,
                       hint_form: str = "instruction") -> Episode:
    """The trajectory's one token sequence, with the policy mask on every sampled token."""
    if getattr(trajectory, "additional_histories", None):
        raise TrajectoryRefused("additional_histories are not supported: artmlx trains one sequence per trajectory")
    exchanges = getattr(trajectory, "exchanges", None)
    turns = _exchange_turns(exchanges, chat) if exchanges else _message_turns(trajectory, chat)
    tokens: list[int] = []
    mask: list[bool] = []
    logprobs: list[float] = []
    choices, versions = 0, []
    for where, item, rebuild_prompt in turns:
        choices += 1
        sampled, sampled_logprobs = choice_tokens(item, where)
        extra = _extra(item)
        if isinstance(extra.get("adapter_version"), int):
            versions.append(extra["adapter_version"])
        modified = extra.get("sampling_modified") or _entries_modified(item)
        if modified:
            raise TrajectoryRefused(f"{where}: sampled with {', '.join(modified)}, which the learner does not "
                                    "reproduce (it recomputes logprobs at temperature only); sample without them")
        used = extra.get("sampling_temperature", _entries_temperature(item))
        if used is not None and abs(float(used) - temperature) > 1e-6:
            raise TrajectoryRefused(f"{where}: sampled at temperature {used}, the learner's is {temperature}; "
                                    "sample with the training temperature (ART's default is 1.0)")
        prompt = extra.get("prompt_token_ids") or rebuild_prompt()
        if not tokens:
            tail = list(prompt)
        elif prompt[: len(tokens)] == tokens:
            tail = list(prompt[len(tokens):])
        else:
            first = next((i for i, (a, b) in enumerate(zip(prompt, tokens)) if a != b), min(len(prompt), len(tokens)))
            raise TrajectoryRefused(
                f"{where}: its prompt does not continue the conversation before it (they differ from token {first}: "
                f"{chat.tokenizer.decode(list(prompt[first:first + 12]))!r} against "
                f"{chat.tokenizer.decode(tokens[first:first + 12])!r}); the chat template renders an earlier reply "
                "differently from the tokens sampled, and artmlx will not re-tokenise it")
        tokens += tail + sampled
        mask += [False] * len(tail) + [True] * len(sampled)
        logprobs += [0.0] * len(tail) + sampled_logprobs
    if not choices:
        raise TrajectoryRefused("no chat completion choice in messages_and_choices and no captured exchange: append "
                                "the response's choice (not choice.message), or capture with art.trajectory(...)")
    if any(not 0 <= t < vocab_size for t in tokens):
        raise TrajectoryRefused(f"a token id is outside the vocabulary [0, {vocab_size})")
    reward = float(trajectory.reward)
    if not math.isfinite(reward):
        raise TrajectoryRefused(f"reward {reward} is not finite")
    episode = Episode(tokens, mask, logprobs, reward=reward, turns=choices,
                      info={"metrics": dict(getattr(trajectory, "metrics", {}) or {}),
                            "adapter_version": min(versions) if versions else None})
    hint = directive_hint(trajectory)
    if hint is not None:
        messages, tools = _opening(trajectory, exchanges)
        try:
            episode.teacher_prompt = chat.prompt_ids(hinted_messages(messages, hint, hint_form), tools)
        except ValueError as error:
            raise TrajectoryRefused(f"its directive hint cannot be placed: {error}") from None
        if any(not 0 <= t < vocab_size for t in episode.teacher_prompt):
            raise TrajectoryRefused(f"a token id of the hint's teacher prompt is outside the vocabulary [0, {vocab_size})")
    return episode


def directive_hint(trajectory) -> str | None:
    """The trajectory's directive hint: `metadata["directive_hint"]` (what `set_directive_hint` writes), or None."""
    metadata = getattr(trajectory, "metadata", None) or {}
    hint = metadata.get(HINT_KEY) if isinstance(metadata, dict) else None
    if hint is None or hint == "":
        return None
    if not isinstance(hint, str):
        raise TrajectoryRefused(f"metadata[{HINT_KEY!r}] must be a string, got {type(hint).__name__}")
    return hint


def _opening(trajectory, exchanges) -> tuple[list[dict], list | None]:
    """The messages (and tools) the first sampled reply answered: where a hint's teacher context starts."""
    if exchanges:
        request = dict(exchanges.chat_completions[0].request)
        return messages_before(list(request.get("messages") or [])), request.get("tools") or None
    items = list(trajectory.messages_and_choices)
    first = next(index for index, item in enumerate(items) if is_choice(item))
    tools = list(trajectory.tools) if getattr(trajectory, "tools", None) else None
    return messages_before(items[:first]), tools
