#!/usr/bin/env python3
"""An on-disk stand-in for the `aws` CLI, enough for ART's S3 backup helpers (art.utils.s3).

Implements `aws [--profile P] s3api head-bucket --bucket B` / `s3api create-bucket --bucket B` (exit 0)
and `aws [--profile P] s3 sync|cp [--delete] [--exclude PATTERN]... SRC DST`, where `s3://bucket/key`
means `$FAKE_S3_ROOT/bucket/key` (default /tmp/art-examples/s3). A sync from a prefix that does not
exist copies nothing and exits 0, as the real CLI does. Each call is logged to stderr and, when
$AWS_ON_DISK_LOG is set, appended to that file.
"""
import fnmatch
import os
import shutil
import sys

ROOT = os.environ.get("FAKE_S3_ROOT", "/tmp/art-examples/s3")


def local(path: str) -> str:
    return os.path.join(ROOT, path[len("s3://"):]) if path.startswith("s3://") else path


def excluded(rel: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) for p in patterns)


def sync(src: str, dst: str, delete: bool, patterns: list[str]) -> None:
    if not os.path.isdir(src):
        return
    os.makedirs(dst, exist_ok=True)
    kept = set()
    for folder, _, files in os.walk(src):
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), src)
            if excluded(rel, patterns):
                continue
            kept.add(rel)
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy2(os.path.join(folder, name), os.path.join(dst, rel))
    if delete:
        for folder, _, files in os.walk(dst):
            for name in files:
                rel = os.path.relpath(os.path.join(folder, name), dst)
                if rel not in kept and not excluded(rel, patterns):
                    os.remove(os.path.join(dst, rel))


def main(argv: list[str]) -> int:
    print(f"[aws-on-disk] aws {' '.join(argv)}", file=sys.stderr)
    if os.environ.get("AWS_ON_DISK_LOG"):  # ART hides the CLI's output unless verbose: keep a record too
        with open(os.environ["AWS_ON_DISK_LOG"], "a") as log:
            log.write(f"aws {' '.join(argv)}\n")
    args = list(argv)
    if args[:1] == ["--profile"]:
        args = args[2:]
    if args[:1] == ["s3api"]:
        if len(args) > 1 and args[1] in ("head-bucket", "create-bucket"):
            bucket = args[args.index("--bucket") + 1]
            os.makedirs(os.path.join(ROOT, bucket), exist_ok=True)
            return 0
        print(f"aws-on-disk: unsupported: {argv}", file=sys.stderr)
        return 2
    if args[:1] != ["s3"] or len(args) < 2 or args[1] not in ("sync", "cp"):
        print(f"aws-on-disk: unsupported: {argv}", file=sys.stderr)
        return 2
    command, rest = args[1], args[2:]
    delete, patterns, paths = False, [], []
    i = 0
    while i < len(rest):
        if rest[i] == "--delete":
            delete = True
        elif rest[i] == "--exclude":
            i += 1
            patterns.append(rest[i])
        elif rest[i].startswith("--"):
            pass  # other flags (--quiet, ...) are accepted and ignored
        else:
            paths.append(rest[i])
        i += 1
    if len(paths) != 2:
        print(f"aws-on-disk: expected SRC DST: {argv}", file=sys.stderr)
        return 2
    src, dst = local(paths[0]), local(paths[1])
    if command == "cp":
        if os.path.isdir(src):
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            if dst.endswith("/") or os.path.isdir(dst):
                dst = os.path.join(dst, os.path.basename(src))
            os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
            shutil.copy2(src, dst)
        return 0
    sync(src, dst, delete, patterns)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
