"""``openenv.core.evals`` without running an evaluation: the ``EvalConfig`` / ``EvalResult``
records, the ``EvalHarness`` contract, and what ``InspectAIHarness`` says before Inspect AI runs
(no model, no Inspect AI installed). Real Inspect AI runs: tests/test_inspect_harness.py."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, List

import pytest
from pydantic import ValidationError

from openenv.core.evals import EvalConfig, EvalHarness, EvalResult, InspectAIHarness

CONFIG = {
    "harness_name": "InspectAIHarness",
    "harness_version": "0.3.285",
    "library_versions": {"openenv": "0.11.0"},
    "dataset": "echo_words",
    "eval_parameters": {"model": "mockllm/model", "max_samples": 2},
}


def test_an_eval_config_needs_every_field() -> None:
    for missing in CONFIG:
        fields = {k: v for k, v in CONFIG.items() if k != missing}
        with pytest.raises(ValidationError, match=missing):
            EvalConfig(**fields)


def test_an_eval_config_refuses_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="extra"):
        EvalConfig(**CONFIG, seed=1)


def test_an_eval_config_validates_assignments() -> None:
    config = EvalConfig(**CONFIG)
    with pytest.raises(ValidationError, match="library_versions"):
        config.library_versions = {"openenv": 11}  # versions are strings
    with pytest.raises(ValidationError, match="harness_version"):
        config.harness_version = None
    config.dataset = "other"
    assert config.dataset == "other"


def test_an_eval_result_refuses_unknown_fields_and_round_trips_as_json() -> None:
    config = EvalConfig(**CONFIG)
    with pytest.raises(ValidationError, match="extra"):
        EvalResult(config=config, scores={}, log="x")
    with pytest.raises(ValidationError, match="scores"):
        EvalResult(config=config)
    result = EvalResult(config=config, scores={"mean": 0.5})
    assert EvalResult.model_validate_json(result.model_dump_json()) == result
    assert json.loads(result.model_dump_json())["config"]["dataset"] == "echo_words"


def test_the_harness_base_cannot_be_instantiated() -> None:
    with pytest.raises(TypeError):
        EvalHarness()  # type: ignore[abstract]


class RecordingHarness(EvalHarness):
    """Scores every run 1.0 and keeps what ``run`` was called with."""

    def __init__(self) -> None:
        self.calls: List[Dict[str, Any]] = []

    def run(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        self.calls.append({"args": args, "kwargs": kwargs})
        return {"accuracy": 1.0}


def test_run_from_config_passes_the_config_by_keyword_and_keeps_the_same_config() -> None:
    harness = RecordingHarness()
    config = EvalConfig(**CONFIG)
    result = harness.run_from_config(config)
    assert harness.calls == [
        {
            "args": (),
            "kwargs": {
                "harness_version": "0.3.285",
                "library_versions": {"openenv": "0.11.0"},
                "dataset": "echo_words",
                "eval_parameters": {"model": "mockllm/model", "max_samples": 2},
            },
        }
    ]
    assert result.config is config
    assert result.scores == {"accuracy": 1.0}


def test_a_harness_is_named_after_its_class() -> None:
    assert RecordingHarness().name == "RecordingHarness"
    assert InspectAIHarness().name == "InspectAIHarness"


def test_the_inspect_harness_needs_a_model() -> None:
    with pytest.raises(ValueError, match=r"eval_parameters\['model'\] is required"):
        InspectAIHarness().run("0.3.285", {}, "echo_words", {"task": "echo_words"})


def test_the_inspect_harness_says_what_to_install_without_inspect_ai(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "inspect_ai", None)  # makes `import inspect_ai` fail
    harness = InspectAIHarness()  # made without Inspect AI: only running needs it
    with pytest.raises(ImportError, match=r"pip install 'openenv\[evals\]'"):
        harness.run("0.3.285", {}, "echo_words", {"model": "mockllm/model"})


def test_the_core_and_the_evals_package_import_without_inspect_ai() -> None:
    """Principle 8: ``import openenv.core`` stays light; evals load Inspect AI only to run."""
    code = (
        "import json, sys\n"
        "import openenv.core\n"
        "loaded = ['openenv.core.evals' in sys.modules]\n"
        "from openenv.core.evals import EvalConfig, InspectAIHarness\n"
        "InspectAIHarness(log_dir='logs').name\n"
        "loaded.append('inspect_ai' in sys.modules)\n"
        "print(json.dumps(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout) == [False, False]
