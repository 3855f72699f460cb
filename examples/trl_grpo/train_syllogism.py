"""GRPO with TRL on a sandboxed Reasoning Gym environment, on a CPU, with a tiny local model.

The environment (``reasoning_gym_env``, dataset ``syllogism``) runs in a sandboxed server; each
GRPO group is one question (a seed derived from the dataset prompt) answered ``--generations``
times. The model answers with one token, ``Y`` or ``N`` (the other tokens are suppressed at
generation), which becomes ``ReasoningGymAction(answer="Yes"/"No")``; the environment scores it.
About two answers in three are "Yes", so a model that learns that bias moves the reward from
about 0.5 towards 0.67; whatever it learns beyond that is the syllogisms themselves.

    python examples/trl_grpo/train_syllogism.py --steps 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_model import build_tiny_model


def answer_from_text(text: str, observation: Any) -> Any:
    """The completion's first letter decides: ``Y`` answers "Yes", anything else "No"."""
    from reasoning_gym_env import ReasoningGymAction

    return ReasoningGymAction(answer="Yes" if text.strip().upper().startswith("Y") else "No")


def question_text(observation: Any) -> str:
    """What the model reads after the dataset prompt: the question and an answer cue."""
    return f"\n{observation.question}\nAnswer: " if observation.question else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--questions", type=int, default=2, help="questions (GRPO groups) per step")
    parser.add_argument("--generations", type=int, default=8, help="answers per question")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="where the model is built and trained (default: a temp dir)")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from reasoning_gym_env import ReasoningGymEnv
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from openenv.integrations.trl import EnvRollout, env_reward, prompt_seed

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    workdir = Path(args.output_dir or tempfile.mkdtemp(prefix="openenv-trl-grpo-"))
    model_dir, params = build_tiny_model(workdir / "tiny-model", seed=args.seed)
    print(f"tiny model: {params:,} parameters in {model_dir}")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    allowed = {tokenizer.convert_tokens_to_ids("Y"), tokenizer.convert_tokens_to_ids("N")}
    suppressed = [i for i in range(len(tokenizer)) if i not in allowed]
    start_weights = [p.detach().clone() for p in model.parameters()]

    def reset_kwargs(prompt: str) -> dict:
        return {"dataset_name": "syllogism", "seed": prompt_seed(prompt), "size": 1}

    started = time.monotonic()
    rollout = EnvRollout(
        ReasoningGymEnv.from_env("reasoning_gym_env"),
        to_action=answer_from_text,
        observation_text=question_text,
        reset_kwargs=reset_kwargs,
    )

    class Progress(TrainerCallback):
        def on_log(self, _args: Any, state: Any, _control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                print(
                    f"step {state.global_step:3d}  env reward {logs['reward']:.3f} "
                    f"(std {logs.get('reward_std', 0.0):.3f})  loss {logs.get('loss', 0.0):+.4f}  "
                    f"{time.monotonic() - started:5.1f} s",
                    flush=True,
                )

    batch = args.questions * args.generations
    config = GRPOConfig(
        output_dir=str(workdir / "run"),
        use_cpu=True,
        per_device_train_batch_size=batch,
        num_generations=args.generations,
        max_completion_length=1,
        generation_kwargs={"suppress_tokens": suppressed},
        temperature=1.0,
        learning_rate=args.lr,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
    )
    dataset = Dataset.from_dict({"prompt": [f"Puzzle {i}." for i in range(args.steps * args.questions)]})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=[Progress()],
    )
    # TRL prints every log dict; the Progress callback prints the short line instead.
    trainer.remove_callback(
        next(c for c in trainer.callback_handler.callbacks if type(c).__name__ == "PrinterCallback")
    )
    try:
        print(f"environment server: {rollout.client.base_url or '(starts with the first batch)'}")
        trainer.train()
    finally:
        rollout.close()
    changed = max((p.detach() - w).abs().max().item() for p, w in zip(model.parameters(), start_weights, strict=True))
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    half = max(1, len(rewards) // 2)
    print(
        f"done in {time.monotonic() - started:.1f} s: mean env reward {sum(rewards[:half]) / half:.3f} "
        f"(first half) -> {sum(rewards[half:]) / max(1, len(rewards) - half):.3f} (second half); "
        f"largest weight change {changed:.4f}"
    )


if __name__ == "__main__":
    main()
