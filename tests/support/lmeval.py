"""lm-eval-harness, run with its own interpreter (a virtual environment of its own:
LMEVAL_PYTHON, .venv-lmeval or /tmp/venv-lmeval) against a server on loopback, on small local
tasks written as files (no dataset hub)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.server import ROOT

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "NO_PROXY": "127.0.0.1"}


def lmeval_python() -> str | None:
    candidates = [os.environ.get("LMEVAL_PYTHON"), str(ROOT / ".venv-lmeval" / "bin" / "python"),
                  "/tmp/venv-lmeval/bin/python"]
    for c in candidates:
        if c and Path(c).is_file() and subprocess.run(
                [c, "-c", "import lm_eval.utils"], capture_output=True, timeout=120).returncode == 0:
            return c
    return None


def require_lmeval() -> str:
    """lm-eval's interpreter; the test skips without it, or fails under CI_REQUIRE_ALL."""
    python = lmeval_python()
    if python is None:
        if os.environ.get("CI_REQUIRE_ALL"):
            pytest.fail("lm-eval is not installed (pip install 'lm-eval==0.4.*' into .venv-lmeval)")
        pytest.skip("lm-eval not installed: pip install 'lm-eval==0.4.*' into .venv-lmeval "
                    "(or point LMEVAL_PYTHON at an interpreter that has it)")
    return python


# Local tasks, one per output type. Each continuation starts with a space and each context ends
# without one, so tokenizing them apart or together gives the same tokens.
MC = [
    {"question": "The capital of France is", "choices": [" Paris", " banana", " Tuesday"],
     "answer": 0},
    {"question": "Two plus two equals", "choices": [" blue", " four", " horse"], "answer": 1},
    {"question": "The sky is", "choices": [" spoon", " shoe", " blue"], "answer": 2},
]
TEXTS = [{"text": "The cat sat on the mat"}, {"text": "Water is made of hydrogen and oxygen"}]
PROMPTS = [{"question": "The capital of France is"}, {"question": "Once upon a time"}]
UNTIL = ["\n", "."]

_TASKS = {
    "vg_mc": ("mc.jsonl", MC, """output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
doc_to_choice: "{{choices}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""),
    "vg_ll": ("ll.jsonl", TEXTS, """output_type: loglikelihood
doc_to_text: "{{text.split(' ')[:-1]|join(' ')}}"
doc_to_target: "{{' '+text.split(' ')[-1]}}"
target_delimiter: ""
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""),
    "vg_rolling": ("ll.jsonl", TEXTS, """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
"""),
    "vg_gen": ("gen.jsonl", PROMPTS, """output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: " Paris"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 16
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""),
}


def write_tasks(folder: Path) -> Path:
    """The local tasks (YAML and JSON lines) in ``folder``, for lm-eval's include_path."""
    for name, (data, rows, body) in _TASKS.items():
        path = folder / data
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        head = (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                f"    test: {path}\ntest_split: test\n")
        (folder / f"{name}.yaml").write_text(head + body + "metadata:\n  version: 1.0\n")
    return folder


# Run with lm-eval's interpreter: evaluate the tasks with a model, write results and samples.
DRIVER = """
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager
model, model_args, include, tasks, out = sys.argv[1:6]
res = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks.split(","),
                              task_manager=TaskManager(include_path=include), log_samples=True,
                              batch_size=1)
keep = ("doc", "arguments", "resps", "filtered_resps")
samples = {t: [{k: s[k] for k in keep} for s in v] for t, v in res["samples"].items()}
json.dump({"results": res["results"], "samples": samples}, open(out, "w"), default=str)
"""


def evaluate(python: str, model: str, model_args: str, tasks: list[str], folder: Path,
             env: dict[str, str] | None = None) -> dict:
    """lm-eval's ``simple_evaluate`` on the local tasks: {results, samples} by task."""
    out = folder / f"out-{model}.json"
    proc = subprocess.run(
        [python, "-c", DRIVER, model, model_args, str(write_tasks(folder)), ",".join(tasks),
         str(out)],
        env={**os.environ, **OFFLINE, **(env or {})}, cwd=folder, capture_output=True,
        text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())
