"""GRPO on blackjack, CPU only: a tiny from-scratch language model learns to play through OpenEnv.

    python examples/grpo_blackjack/train.py                # about 2 minutes on 2 CPU cores
    python examples/grpo_blackjack/train.py --help

Blackjack is ``openspiel_env`` served in the sandbox (SandboxProvider, through
``OpenSpielEnv.from_env``). Every update plays ``--deals`` deals ``--group`` times each with
:func:`openenv.core.rollout.rollout` (concurrent sessions, the model's forward pass batched over
them), normalises each episode's return within its deal's group, and takes one policy-gradient
step with an entropy bonus. Greedy play is then evaluated on held-out deals against the random,
always-STAND and best "hit below N" baselines; the figures go to ``--out`` as JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

import torch
from openspiel_env import OpenSpielAction, OpenSpielEnv
from tiny_lm import CARDS, TinyLM, encode, entropy_of, parameters_count

from openenv.core.rollout import BatchedPolicy, RolloutResult, rollout

HIT, STAND = 0, 1
EVAL_SEED_BASE = 10_000_000  # training deals use seeds below this, evaluation deals at or above it
HERE = Path(__file__).resolve().parent


@dataclass
class Config:
    updates: int = 600
    deals: int = 16
    group: int = 8
    lr: float = 3e-4
    entropy: float = 0.05
    eval_every: int = 20
    eval_deals: int = 2000
    curve_deals: int = 500
    concurrency: int = 32
    d_model: int = 48
    layers: int = 2
    seed: int = 0
    threads: int = 1
    out: str = str(HERE / "out")
    isolation: str = "sandbox"


# --- playing ---------------------------------------------------------------------------------------


class LMPlayer:
    """The model as a batched policy: one forward pass for the requests of all sessions."""

    def __init__(self, model: TinyLM, greedy: bool, generator: torch.Generator) -> None:
        self.model = model
        self.greedy = greedy
        self.generator = generator

    def __call__(self, observations: List[Any], episodes: List[Any]) -> List[OpenSpielAction]:
        with torch.no_grad():
            logits = self.model.action_logits([encode(o.metadata) for o in observations])
        if self.greedy:
            choice = logits.argmax(-1)
        else:
            choice = torch.multinomial(torch.softmax(logits, -1), 1, generator=self.generator).squeeze(-1)
        return [OpenSpielAction(action_id=int(a), game_name="blackjack") for a in choice]


def deals(seeds: Sequence[int]) -> List[Dict[str, Any]]:
    return [{"seed": s, "game_name": "blackjack"} for s in seeds]


def play(env: Any, policy: Callable[..., Any], seeds: Sequence[int], cfg: Config, group: int = 1) -> RolloutResult:
    result = rollout(env, policy, deals(seeds), group_size=group, concurrency=cfg.concurrency, max_steps=12)
    if result.summary.errors:
        first = next(e.error for e in result.episodes if e.error)
        raise RuntimeError(f"{result.summary.errors} episodes failed, the first with: {first}")
    return result


def model_policy(model: TinyLM, greedy: bool, generator: torch.Generator) -> BatchedPolicy:
    return BatchedPolicy(LMPlayer(model, greedy, generator), max_batch=256, max_wait_s=0.001)


def rates(returns: Sequence[float]) -> Dict[str, float]:
    n = len(returns)
    return {
        "win": sum(r > 0 for r in returns) / n,
        "loss": sum(r < 0 for r in returns) / n,
        "push": sum(r == 0 for r in returns) / n,
        "mean_return": sum(returns) / n,
        "deals": n,
    }


def returns_of(result: RolloutResult) -> List[float]:
    return [e.total_return for e in result.episodes]


def baselines(env: Any, seeds: Sequence[int], cfg: Config) -> Dict[str, List[float]]:
    """Per-deal returns of the random, always-STAND and every "hit below N" policy on ``seeds``."""
    found = {
        "random": returns_of(play(env, _random_move, seeds, cfg)),
        "always_stand": returns_of(play(env, lambda o, e: OpenSpielAction(action_id=STAND), seeds, cfg)),
    }
    for n in range(10, 22):
        found[f"hit_below_{n}"] = returns_of(play(env, _threshold(n), seeds, cfg))
    return found


def _random_move(observation: Any, episode: Any) -> OpenSpielAction:
    rng = random.Random(f"{episode.reset_kwargs['seed']}/{episode.step}")  # the same moves on every run
    return OpenSpielAction(action_id=rng.choice(observation.legal_actions))


def _threshold(n: int) -> Callable[..., OpenSpielAction]:
    return lambda o, e: OpenSpielAction(action_id=HIT if o.metadata["player_total"] < n else STAND)


# --- learning --------------------------------------------------------------------------------------


def grpo_update(
    model: TinyLM, optimizer: torch.optim.Optimizer, result: RolloutResult, cfg: Config
) -> Dict[str, float]:
    """One GRPO step on the episodes of ``result``: every decision of an episode is credited with the
    episode's return normalised within its group (its deal), plus an entropy bonus."""
    advantages = result.advantages()
    prompts, actions, credit = [], [], []
    for episode, advantage in zip(result.episodes, advantages, strict=True):
        for observation, action in zip(episode.observations, episode.actions, strict=False):
            prompts.append(encode(observation.metadata))
            actions.append(action.action_id)
            credit.append(advantage)
    logits = model.action_logits(prompts)
    logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(actions).unsqueeze(1)).squeeze(1)
    entropy = entropy_of(logits).mean()
    surrogate = -(torch.tensor(credit) * logp).mean()
    loss = surrogate - cfg.entropy * entropy
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return {
        "loss": loss.item(),
        "surrogate": surrogate.item(),
        "entropy": entropy.item(),
        "grad_norm": float(grad_norm),
        "decisions": len(prompts),
        "mean_return": result.summary.mean_return,
        "mean_abs_advantage": sum(abs(a) for a in advantages) / len(advantages),
    }


def greedy_table(model: TinyLM) -> Dict[str, str]:
    """The greedy move for hard totals 5-20 (a two-card hand) against each dealer card: H or S."""
    table = {}
    with torch.no_grad():
        for total in range(5, 21):
            low = max(2, total - 10)
            hand = [str(low), str(total - low)]
            prompts = [
                encode({"player_cards": hand, "player_total": total, "player_soft": False, "dealer_shows": card})
                for card in CARDS[:10]
            ]
            moves = model.action_logits(prompts).argmax(-1).tolist()
            table[str(total)] = "".join("HS"[m] for m in moves)
    return table


# --- the run ---------------------------------------------------------------------------------------


def train(cfg: Config) -> Dict[str, Any]:
    began = time.perf_counter()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model = TinyLM(d_model=cfg.d_model, layers=cfg.layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    # the learning rate falls linearly to zero: the greedy policy settles instead of wandering
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / cfg.updates)
    sampler = torch.Generator().manual_seed(cfg.seed)
    eval_seeds = list(range(EVAL_SEED_BASE, EVAL_SEED_BASE + cfg.eval_deals))
    curve_n = min(cfg.curve_deals, cfg.eval_deals)
    say(f"model: {parameters_count(model):,} parameters; {cfg.deals} deals x {cfg.group} rollouts per update")

    with OpenSpielEnv.from_env("openspiel_env", isolation=cfg.isolation).sync() as env:
        say(f"openspiel_env serving at {env.async_client.base_url} ({cfg.isolation})")
        tick = time.perf_counter()
        base = baselines(env, eval_seeds, cfg)
        thresholds = {k: v for k, v in base.items() if k.startswith("hit_below_")}
        best = max(thresholds, key=lambda k: rates(thresholds[k])["win"])
        say(f"baselines on {cfg.eval_deals} deals in {time.perf_counter() - tick:.1f} s: " + baseline_line(base, best))
        curve_base = {k: v[:curve_n] for k, v in base.items()}
        say(f"the same on the first {curve_n} of them, the curve's deals: " + baseline_line(curve_base, best))

        def greedy_returns(n: int) -> List[float]:
            return returns_of(play(env, model_policy(model, True, sampler), eval_seeds[:n], cfg))

        initial = rates(greedy_returns(cfg.eval_deals))
        say(f"greedy before training: win {initial['win']:.1%}, loss {initial['loss']:.1%}")
        curve = [{"update": 0, **rates(greedy_returns(curve_n))}]
        history = []
        train_began = time.perf_counter()
        for update in range(1, cfg.updates + 1):
            seeds = range((update - 1) * cfg.deals, update * cfg.deals)
            result = play(env, model_policy(model, False, sampler), seeds, cfg, group=cfg.group)
            stats = grpo_update(model, optimizer, result, cfg)
            schedule.step()
            stats.update(update=update, rollout_s=result.summary.wall_s)
            history.append(stats)
            if not all(math.isfinite(v) for v in stats.values()):
                raise RuntimeError(f"non-finite training figures at update {update}: {stats}")
            if update % cfg.eval_every == 0 or update == cfg.updates:
                point = {"update": update, **rates(greedy_returns(curve_n))}
                curve.append(point)
                recent = history[-cfg.eval_every :]
                sampled = sum(h["mean_return"] for h in recent) / len(recent)
                say(
                    f"update {update:4d}  sampled return {sampled:+.3f}  entropy {stats['entropy']:.3f}  "
                    f"greedy win {point['win']:.1%} (held-out {curve_n})  {time.perf_counter() - train_began:.0f} s"
                )
        train_s = time.perf_counter() - train_began
        final = rates(greedy_returns(cfg.eval_deals))

    report = {
        "config": asdict(cfg),
        "parameters": parameters_count(model),
        "greedy_before": initial,
        "greedy_after": final,
        "baselines": {k: rates(v) for k, v in base.items()},
        "best_threshold": best,
        "curve_baselines": {k: rates(v)["win"] for k, v in curve_base.items() if k in ("random", "always_stand", best)},
        "curve": curve,
        "history": history,
        "greedy_table_hard_totals": greedy_table(model),
        "train_s": train_s,
        "wall_s": time.perf_counter() - began,
    }
    (out / "results.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "learning_curve.png")
    torch.save(model.state_dict(), out / "model.pt")
    say(
        f"greedy after {cfg.updates} updates on {cfg.eval_deals} held-out deals: win {final['win']:.1%}, "
        f"loss {final['loss']:.1%} (before: {initial['win']:.1%}; {baseline_line(base, best)}); "
        f"{report['wall_s']:.0f} s in all; figures in {out}"
    )
    return report


def baseline_line(base: Dict[str, List[float]], best: str) -> str:
    return ", ".join(f"{k} {rates(base[k])['win']:.1%}" for k in ("random", "always_stand", best))


def plot(report: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = report["curve"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([p["update"] for p in curve], [p["win"] for p in curve], marker="o", ms=3, label="GRPO policy (greedy)")
    styles = {"random": ":", "always_stand": "--", report["best_threshold"]: "-."}
    for name, win in report["curve_baselines"].items():
        ax.axhline(win, linestyle=styles[name], color="gray", label=f"{name.replace('_', ' ')} ({win:.1%})")
    n = curve[0]["deals"]
    ax.set(xlabel="update", ylabel=f"win rate on {n} held-out deals", title="Blackjack GRPO, tiny LM on CPU")
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def say(message: str) -> None:
    print(message, flush=True)


def parse(argv: Sequence[str]) -> Config:
    defaults = Config()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if name == "isolation":
            parser.add_argument(flag, default=value, choices=["sandbox", "none"], help="how the env server runs")
        else:
            parser.add_argument(flag, type=type(value), default=value, help=f"default {value}")
    return Config(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] = ()) -> Dict[str, Any]:
    return train(parse(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
