"""Parse once (issue 39, Deliver 2): every generation answer, whole or streamed, native or OpenAI, is read
into a typed `Answer` by pytest_dflash/client/answers.py, and every check judges that, never the raw JSON (the
structured checks once walked the body seven times, and one of those readings took a call whose arguments were
"null" for "no output at all"). The walk finds each reading of an answer's keys in layers/ and client/: only
client/answers.py may read them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "pytest_dflash"
ANSWER_KEYS = frozenset({"choices", "finish_reason", "meta_info", "tool_calls", "reasoning_content"})
READER = PACKAGE / "client" / "answers.py"  # the one place an answer's keys are read


def key_reads(path: Path) -> list[tuple[int, str]]:
    """(line, key) of each reading of an answer key: `x["key"]`, `x.get("key")` / `.pop` / `.setdefault`,
    `"key" in x`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        keys: list[ast.expr] = []
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args):
            keys = [node.args[0]]
        elif isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            keys = [node.left]
        found += [(node.lineno, key.value) for key in keys
                  if isinstance(key, ast.Constant) and key.value in ANSWER_KEYS]
    return sorted(found)


def test_no_layer_and_no_other_client_module_reads_an_answers_json() -> None:
    files = sorted([*(PACKAGE / "layers").rglob("*.py"), *(PACKAGE / "client").rglob("*.py")])
    assert len(files) > 40  # the walk saw the trees
    raw = [f"{f.relative_to(PACKAGE)}:{line}: reads {key!r}" for f in files if f != READER
           for line, key in key_reads(f)]
    assert not raw, "answer JSON read outside client/answers.py (read it there, judge the Answer):\n" + "\n".join(raw)
    assert key_reads(READER), "client/answers.py reads no answer key: the walk is broken"


def test_the_walker_sees_each_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('def f(data, event):\n    a = data["choices"][0]\n    b = event.get("meta_info")\n'
                      '    c = "tool_calls" in a\n    d = data["text"]\n    e = f"{a} finish_reason"\n')
    assert key_reads(sample) == [(2, "choices"), (3, "meta_info"), (4, "tool_calls")]
