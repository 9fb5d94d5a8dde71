"""The fuzzing corpus kept in the repository (tests/fuzz/corpus): seed inputs
every run replays and the property tests start their mutations from. A file
per target: `NAME.txt` holds one text input a line (`\\xNN`, `\\uNNNN`, `\\r`,
`\\n` and `\\\\` escapes, so any character fits on a line; `#` starts a comment
line), `NAME/` a directory of binary inputs, one a file."""

from __future__ import annotations

from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "corpus"


def text_seeds(name: str) -> list[str]:
    lines = (CORPUS / f"{name}.txt").read_text(encoding="utf-8").splitlines()
    return [line.encode("latin-1", "backslashreplace").decode("unicode_escape")
            for line in lines if line and not line.startswith("#")]


def binary_seeds(name: str) -> list[bytes]:
    return [path.read_bytes() for path in sorted((CORPUS / name).iterdir()) if path.is_file()]
