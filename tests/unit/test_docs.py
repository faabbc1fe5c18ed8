"""The docs match the code: every invariant the code cites by number is in docs/ARCHITECTURE.md's
table under that number, and every file of the project that the code or the docs name exists."""
from __future__ import annotations

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: a path of the project as text names it: from one of its top folders, to a file with an extension
_PATH = re.compile(r"(?<![\w./-])((?:server|catalog|lifecycle|chunk_store|tests|bench|docs|docker|scripts|proto|"
                   r"iox_spark|pyspark_iox)/[\w./-]*\w\.(?:py|md|proto|sh|json|toml|c|yml|yaml))\b")
#: "docs/ARCHITECTURE.md invariant 8", and "invariants 1-4 and 7b of docs/ARCHITECTURE.md"
_CITED = re.compile(r"docs/ARCHITECTURE\.md,? invariant (\d+[a-z]?)")
_CITED_MANY = re.compile(r"invariants ((?:\d+[a-z]?(?:-\d+)?(?:, | and )?)+) (?:of|in) docs/ARCHITECTURE\.md")


def _numbers(many: str) -> list:
    """The invariant numbers of "1-4 and 7b" (a range: each number in it)."""
    out = []
    for part in re.split(r", | and ", many):
        lo, _sep, hi = part.partition("-")
        out += [str(n) for n in range(int(lo), int(hi) + 1)] if hi else [part]
    return out


def _tracked() -> list:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines()
            if p.endswith((".py", ".md", ".proto", ".sh", ".toml", ".yml", ".yaml")) or p.endswith("Dockerfile")]


def _text(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def test_every_invariant_cited_by_number_is_in_the_architectures_table():
    table = set(re.findall(r"^\| (\d+[a-z]?) \|", _text("docs/ARCHITECTURE.md"), re.M))
    cited = {(p, n) for p in _tracked() for n in _CITED.findall(_text(p))}
    cited |= {(p, n) for p in _tracked() for many in _CITED_MANY.findall(_text(p)) for n in _numbers(many)}
    assert _numbers("1-4 and 7b") == ["1", "2", "3", "4", "7b"]
    assert cited, "the code cites invariants by number"
    assert sorted((p, n) for p, n in cited if n not in table) == []


def test_every_project_file_named_in_code_or_docs_exists():
    tracked = _tracked()
    files = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.splitlines())
    missing = []
    for p in tracked:
        for named in _PATH.findall(_text(p)):
            if named not in files and not os.path.exists(os.path.join(ROOT, named)):
                missing.append((p, named))
    assert sorted(set(missing)) == []


def test_every_short_name_of_the_glossary_is_used_in_the_code():
    """The glossary does not go stale: each short name it explains (a backticked name in its first
    column) is still a name in the code of the server's packages."""
    doc = _text("docs/ARCHITECTURE.md")
    section = doc.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    names = {n for row in re.findall(r"^\| ([^|]+) \|", section, re.M) for n in re.findall(r"`(\w+)`", row)}
    assert {"kp", "pc", "dbck"} <= names
    code = "\n".join(_text(p) for p in _tracked()
                     if p.endswith(".py") and p.startswith(("server/", "catalog/", "lifecycle/")))
    assert sorted(n for n in names if not re.search(rf"\b{n}\b", code)) == []
