"""TRL's GRPOTrainer rolling out in OpenEnv environments (``openenv.integrations.trl``).

Every environment here is a real server in a sandbox (echo_env for MCP tools, reasoning_gym_env
for a typed action). The fast tests drive the adapter with a scripted policy standing in for the
model; the slow one trains a tiny local model with GRPOTrainer for a few steps.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import pytest

pytest.importorskip("torch", reason="the TRL integration needs torch (pip install torch)")
pytest.importorskip("trl", reason="the TRL integration needs TRL (pip install 'trl>=1.16')")
pytest.importorskip("echo_env", reason="echo_env is not installed (pip install -e envs/echo_env)")
pytest.importorskip(
    "reasoning_gym_env", reason="reasoning_gym_env is not installed (pip install -e envs/reasoning_gym_env)"
)

from echo_env import EchoEnv
from reasoning_gym_env import ReasoningGymAction, ReasoningGymEnv

from openenv.core.containers.runtime.isolation import find_bwrap
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.integrations import trl as openenv_trl
from openenv.integrations.trl import EnvironmentFactory, EnvRollout, env_reward, prompt_seed

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples" / "trl_grpo"


def _tiny_model_module() -> Any:
    spec = importlib.util.spec_from_file_location("trl_grpo_tiny_model", EXAMPLE_DIR / "tiny_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return _tiny_model_module().build_tokenizer()


class ScriptedTrainer:
    """Stands in for GRPOTrainer where EnvRollout calls it: each generation call answers with the
    next scripted texts (one per prompt) and records the prompts it was given."""

    use_vllm = False

    def __init__(self, tokenizer: Any, turns: Sequence[Sequence[str]], logprob: Optional[float] = None) -> None:
        self.processing_class = tokenizer
        self._turns = list(turns)
        self._logprob = logprob
        self.seen: List[List[List[int]]] = []

    def _generate_single_turn(self, prompt_ids: List[List[int]], images: Any, fields: Dict, n: int) -> Any:
        assert images is None and n == 1
        self.seen.append(prompt_ids)
        texts = self._turns.pop(0)
        assert len(texts) == len(prompt_ids)
        eos = self.processing_class.eos_token_id
        completions = [[*self.processing_class.encode(t, add_special_tokens=False), eos] for t in texts]
        if self._logprob is None:
            return completions, None
        return completions, [[self._logprob] * len(c) for c in completions]


def echo_action(text: str, observation: Any) -> CallToolAction:
    return CallToolAction(tool_name="echo_message", arguments={"message": text})


@pytest.fixture
def echo_rollout() -> Iterator[EnvRollout]:
    with EnvRollout(EchoEnv.from_env("echo_env"), to_action=echo_action, observation_text=lambda obs: None) as rollout:
        yield rollout


# --- helpers ---------------------------------------------------------------------------------------


def test_prompt_seed_depends_only_on_the_prompt() -> None:
    assert prompt_seed("Puzzle 1.") == prompt_seed("Puzzle 1.")
    assert prompt_seed("Puzzle 1.") != prompt_seed("Puzzle 2.")
    chat = [{"role": "user", "content": "hi"}]
    assert prompt_seed(chat) == prompt_seed([{"content": "hi", "role": "user"}])
    assert 0 <= prompt_seed(chat) < 2**31


def test_env_reward_hands_back_the_rewards_the_rollout_returned() -> None:
    assert env_reward(["a", "b"], env_reward=[1, 0.5], env_turns=[1, 1]) == [1.0, 0.5]


def test_env_reward_without_a_rollout_says_what_to_use() -> None:
    with pytest.raises(ValueError, match="EnvRollout"):
        env_reward(["a"])


def test_a_missing_trl_is_reported_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(ImportError, match="pip install 'trl"):
        openenv_trl.require_trl("rollout_func")


def test_a_trl_without_the_hook_is_reported_with_its_version() -> None:
    with pytest.raises(ImportError, match=r"no GRPOTrainer\(no_such_hook=\.\.\.\)"):
        openenv_trl.require_trl("no_such_hook")


def test_a_blocking_client_is_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match=r"not client\.sync"):
        EnvRollout(EchoEnv(base_url="http://127.0.0.1:9").sync(), to_action=echo_action)  # type: ignore[arg-type]


# --- EnvRollout ------------------------------------------------------------------------------------


def test_rollout_returns_what_grpo_trainer_requires(echo_rollout: EnvRollout, tokenizer: Any) -> None:
    trainer = ScriptedTrainer(tokenizer, [["hello", "hi"]])
    output = echo_rollout(["Say:", "Say:"], trainer)
    eos = tokenizer.eos_token_id
    assert output["prompt_ids"] == [tokenizer.encode("Say:", add_special_tokens=False)] * 2
    assert output["completion_ids"] == [
        [*tokenizer.encode("hello", add_special_tokens=False), eos],
        [*tokenizer.encode("hi", add_special_tokens=False), eos],
    ]
    assert output["logprobs"] is None  # the transformers backend gives none; TRL recomputes them
    assert "env_mask" not in output


def test_rollout_rewards_are_the_environments(echo_rollout: EnvRollout, tokenizer: Any) -> None:
    trainer = ScriptedTrainer(tokenizer, [["hello", "", "abc"]])
    output = echo_rollout(["Say:", "Say:", "Say:"], trainer)
    # echo_env's server pays 0.1 per echoed character
    assert output["env_reward"] == pytest.approx([0.5, 0.0, 0.3])
    assert output["env_turns"] == [1, 1, 1]


def test_rollout_sessions_are_reused_across_batches(echo_rollout: EnvRollout, tokenizer: Any) -> None:
    echo_rollout(["a", "b"], ScriptedTrainer(tokenizer, [["x", "y"]]))
    first = list(echo_rollout._sessions._idle)
    echo_rollout(["c", "d"], ScriptedTrainer(tokenizer, [["x", "y"]]))
    assert sorted(map(id, echo_rollout._sessions._idle)) == sorted(map(id, first))


def test_multi_turn_rollout_masks_the_environments_tokens(tokenizer: Any) -> None:
    client = EchoEnv.from_env("echo_env")
    with EnvRollout(client, to_action=echo_action, max_turns=2) as rollout:
        trainer = ScriptedTrainer(tokenizer, [["ab"], ["cde"]])
        output = rollout(["Say:"], trainer)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    eos = tokenizer.eos_token_id
    first, feedback, second = [*encode("ab"), eos], encode("ab"), [*encode("cde"), eos]
    assert output["completion_ids"] == [first + feedback + second]
    assert output["env_mask"] == [[1] * len(first) + [0] * len(feedback) + [1] * len(second)]
    assert trainer.seen[1] == [output["prompt_ids"][0] + first + feedback]  # turn 2 sees the echo
    assert output["env_reward"] == pytest.approx([0.5])
    assert output["env_turns"] == [2]


def test_backend_logprobs_are_kept_and_environment_tokens_get_zero(tokenizer: Any) -> None:
    with EnvRollout(EchoEnv.from_env("echo_env"), to_action=echo_action, max_turns=2) as rollout:
        output = rollout(["Say:"], ScriptedTrainer(tokenizer, [["ab"], ["c"]], logprob=-0.5))
    assert output["logprobs"] == [[-0.5] * 3 + [0.0] * 2 + [-0.5] * 2]  # "ab"+eos, echo "ab", "c"+eos


def test_a_reset_that_ends_the_episode_is_reported(tokenizer: Any) -> None:
    client = ReasoningGymEnv.from_env("reasoning_gym_env")
    with EnvRollout(
        client, to_action=lambda text, obs: None, reset_kwargs=lambda p: {"dataset_name": "nope"}
    ) as rollout:
        with pytest.raises(RuntimeError, match="unknown dataset 'nope'"):
            rollout(["P1"], ScriptedTrainer(tokenizer, [["x"]]))


def test_equal_prompts_get_the_same_task_and_others_another(tokenizer: Any) -> None:
    """A GRPO group (one prompt, several completions) must be scored on one question."""

    def question(observation: Any) -> str:
        return f"\n{observation.question}\n"

    client = ReasoningGymEnv.from_env("reasoning_gym_env")
    rollout = EnvRollout(
        client,
        to_action=lambda text, obs: ReasoningGymAction(answer=text),
        observation_text=question,
        reset_kwargs=lambda prompt: {"dataset_name": "syllogism", "seed": prompt_seed(prompt), "size": 1},
    )
    with rollout:
        output = rollout(["P1", "P1", "P2"], ScriptedTrainer(tokenizer, [["Yes", "No", "Yes"]]))
    texts = [tokenizer.decode(ids) for ids in output["prompt_ids"]]
    assert texts[0] == texts[1] and texts[0] != texts[2]
    assert texts[0].startswith("P1\n") and "Answer Yes or No" in texts[0]
    assert sorted(output["env_reward"][:2]) == [0.0, 1.0]  # one of Yes/No is right


def test_rollout_runs_at_most_max_sessions_episodes_at_once(tokenizer: Any) -> None:
    with EnvRollout(EchoEnv.from_env("echo_env"), to_action=echo_action, max_sessions=2) as rollout:
        trainer = ScriptedTrainer(tokenizer, [["a", "bb"], ["ccc"]])
        output = rollout(["1", "2", "3"], trainer)
        assert rollout._sessions._opened == 2
    assert [len(batch) for batch in trainer.seen] == [2, 1]
    assert output["env_reward"] == pytest.approx([0.1, 0.2, 0.3])


# --- EnvironmentFactory ----------------------------------------------------------------------------


def test_mcp_tools_become_methods_that_transformers_can_describe() -> None:
    from transformers.utils import get_json_schema

    with EnvironmentFactory(EchoEnv.from_env("echo_env")) as factory:
        assert factory.tool_names == ["echo_message", "echo_with_length"]
        env = factory()
        schema = get_json_schema(env.echo_message)["function"]
    assert schema["name"] == "echo_message"
    assert schema["parameters"]["properties"]["message"]["type"] == "string"
    assert schema["parameters"]["required"] == ["message"]


def test_tool_calls_step_the_environment_and_earn_its_reward() -> None:
    with EnvironmentFactory(EchoEnv.from_env("echo_env"), tools=["echo_message"]) as factory:
        first, second = factory(), factory()
        assert "echoed_message" in first.reset(prompt="p")
        second.reset(prompt="p")
        assert first.echo_message(message="hello") == "hello"
        assert first.echo_message(message="hi") == "hi"
        assert first.get_reward() == pytest.approx(0.7)
        assert second.get_reward() == 0.0  # its own session
        first.reset(prompt="p")
        assert first.reward == 0.0


def test_unknown_tool_names_are_refused() -> None:
    with EnvironmentFactory(EchoEnv.from_env("echo_env"), tools=["nope"]) as factory:
        with pytest.raises(ValueError, match="no tools \\['nope'\\]"):
            factory()


def test_a_typed_environment_gets_one_tool_with_the_actions_fields() -> None:
    def reset_kwargs(row: Dict[str, Any]) -> Dict[str, Any]:
        return {"dataset_name": "syllogism", "seed": prompt_seed(row["prompt"]), "size": 1}

    factory = EnvironmentFactory(
        ReasoningGymEnv.from_env("reasoning_gym_env"), action_tool="answer", reset_kwargs=reset_kwargs
    )
    with factory:
        assert factory.tool_names == ["answer"]
        env = factory()
        question = env.reset(prompt="Puzzle 1.")
        assert "Answer Yes or No" in question
        correct: Optional[str] = None
        for guess in ("Yes", "No"):
            assert env.reset(prompt="Puzzle 1.") == question  # same prompt, same question
            env.answer(answer=guess)
            assert env.done
            if env.get_reward() == 1.0:
                correct = guess
        assert correct is not None
        with pytest.raises(RuntimeError, match="episode is over"):
            env.answer(answer=correct)


# --- training --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_grpo_trainer_learns_from_echo_env_rewards(tmp_path: Path) -> None:
    """A few GRPO steps on CPU: the rewards are the sandboxed server's, and the weights move."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model_dir, _ = _tiny_model_module().build_tiny_model(tmp_path / "model", seed=0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    start = [p.detach().clone() for p in model.parameters()]
    scored: List[tuple] = []

    def recorded_env_reward(completions: List[str], **kwargs: Any) -> List[float]:
        rewards = env_reward(completions, **kwargs)
        scored.extend(zip(completions, rewards, strict=True))
        return rewards

    config = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        use_cpu=True,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-2,
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    dataset = Dataset.from_dict({"prompt": [f"Say something {i}:" for i in range(16)]})
    with EnvRollout(EchoEnv.from_env("echo_env"), to_action=echo_action) as rollout:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=recorded_env_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=rollout,
        )
        trainer.train()

    assert len(scored) == 3 * 8
    # echo_env pays 0.1 per character of the message it echoed: the completion's text
    assert [reward for _, reward in scored] == pytest.approx([0.1 * len(text) for text, _ in scored])
    assert any(reward > 0 for _, reward in scored)
    assert max((p.detach() - w).abs().max().item() for p, w in zip(model.parameters(), start, strict=True)) > 0
    logged = [log for log in trainer.state.log_history if "reward" in log]
    assert len(logged) == 3 and all(torch.isfinite(torch.tensor(log["loss"])) for log in logged)


class ScriptedToolCaller:
    """Stands in for the model's sampling inside a real GRPOTrainer (``_generate_single_turn``):
    a first turn calls ``echo_message`` with the next of ``messages`` in Qwen 3's tool-call format;
    the turn after a tool's response ends the answer. Keeps every prompt it generated from."""

    def __init__(self, tokenizer: Any, messages: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.messages = list(messages)
        self.calls = 0
        self.prompts: List[str] = []

    def __call__(self, prompt_ids: List[List[int]], *args: Any, **kwargs: Any) -> Any:
        import json

        completions = []
        for ids in prompt_ids:
            text = self.tokenizer.decode(ids)
            self.prompts.append(text)
            if "<tool_response>" in text.rsplit("<|im_start|>assistant", 2)[-2]:
                reply = "Done.<|im_end|>"
            else:
                message = self.messages[self.calls % len(self.messages)]
                self.calls += 1
                call = json.dumps({"name": "echo_message", "arguments": {"message": message}})
                reply = f"<tool_call>\n{call}\n</tool_call><|im_end|>"
            completions.append(self.tokenizer.encode(reply, add_special_tokens=False))
        return completions, None


@pytest.mark.slow
def test_grpo_trainer_calls_the_environments_tools_through_environment_factory(tmp_path: Path) -> None:
    """GRPOTrainer(environment_factory=...): TRL shows the model the environment's tools, runs the
    tool calls the model makes against the sandboxed server, and trains on the reward each
    session earned (get_reward). The sampling is scripted (a random tiny model makes no tool
    calls); the chat template, the parsing of tool calls, the tool loop, the rewards and the
    update are TRL's own."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, Qwen2Config
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_chat_template

    tokenizer = _tiny_model_module().build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = qwen3_chat_template  # TRL knows how to parse its tool calls
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    start = [p.detach().clone() for p in model.parameters()]
    sampler = ScriptedToolCaller(tokenizer, ["hello", "hi", "hey!", "x"])

    class ScriptedSamplingGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids: List[List[int]], *args: Any, **kwargs: Any) -> Any:
            return sampler(prompt_ids)

    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        use_cpu=True,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=256,
        learning_rate=1e-2,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Echo something {i}."}] for i in range(8)]})
    with EnvironmentFactory(EchoEnv.from_env("echo_env"), tools=["echo_message"]) as factory:
        trainer = ScriptedSamplingGRPOTrainer(
            model=model, args=args, train_dataset=dataset, processing_class=tokenizer, environment_factory=factory
        )
        trainer.train()
        # the last batch's four sessions, each with the reward its one tool call earned on the server
        assert sorted(env.get_reward() for env in trainer.environments) == pytest.approx([0.1, 0.2, 0.4, 0.5])

    logged = [log for log in trainer.state.log_history if "reward" in log]
    assert len(logged) == 2
    for log in logged:
        assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0
        # echo_env pays 0.1 per echoed character: "hello", "hi", "hey!", "x" -> mean 0.3
        assert log["rewards/EchoEnvTools/mean"] == pytest.approx(0.3)
    # the model saw the tools in its prompt and, after its call, the server's answer
    assert '"name": "echo_message"' in sampler.prompts[0]
    answered = [p for p in sampler.prompts if "<tool_response>" in p]
    assert len(answered) == 8 and "<tool_response>\nhello\n</tool_response>" in answered[0]
    assert max((p.detach() - w).abs().max().item() for p, w in zip(model.parameters(), start, strict=True)) > 0


@pytest.mark.slow
def test_the_example_trains_on_reasoning_gym(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE_DIR / "train_syllogism.py"), "--steps", "3", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 3
    assert "largest weight change" in result.stdout
