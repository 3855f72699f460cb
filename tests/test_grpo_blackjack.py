"""The CPU GRPO blackjack example runs end to end: sandboxed server, rollouts, updates, figures."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from openenv.core.containers.runtime.isolation import find_bwrap

torch = pytest.importorskip("torch", reason="the GRPO example needs torch (pip install torch)")
pytest.importorskip("openspiel_env", reason="the GRPO example needs envs/openspiel_env installed")
pytest.importorskip("matplotlib", reason="the GRPO example plots with matplotlib")

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grpo_blackjack"


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import tiny_lm
        import train

        yield train, tiny_lm
    finally:
        sys.path.remove(str(EXAMPLE))
        for name in ("train", "tiny_lm"):  # generic names: leave no trace for other tests
            sys.modules.pop(name, None)


def test_the_prompt_shows_the_hand_and_the_dealer_card(example) -> None:
    _, tiny_lm = example
    facts = {"player_cards": ["A", "6"], "player_total": 17, "player_soft": True, "dealer_shows": "10"}
    words = [tiny_lm.VOCAB[i] for i in tiny_lm.encode(facts)]
    assert words == "<bos> you hold A 6 total 17 soft dealer shows 10 you say".split()


def test_grpo_updates_on_sandboxed_rollouts_change_the_policy(example) -> None:
    train, tiny_lm = example
    from openspiel_env import OpenSpielEnv

    cfg = train.Config(deals=4, group=4, lr=3e-3, concurrency=8)
    torch.manual_seed(0)
    model = tiny_lm.TinyLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sampler = torch.Generator().manual_seed(0)
    probe = [
        tiny_lm.encode({"player_cards": ["10", "6"], "player_total": 16, "player_soft": False, "dealer_shows": "9"})
    ]
    with torch.no_grad():
        before = torch.softmax(model.action_logits(probe), -1)
    with OpenSpielEnv.from_env("openspiel_env").sync() as env:
        for update in range(3):
            seeds = range(update * cfg.deals, (update + 1) * cfg.deals)
            result = train.play(env, train.model_policy(model, False, sampler), seeds, cfg, group=cfg.group)
            assert result.summary.completed == 16
            groups = [[e for e in result.episodes if e.group == g] for g in range(cfg.deals)]
            assert all(len({e.observations[0].text for e in g}) == 1 for g in groups)
            advantages = result.advantages()
            assert all(math.isfinite(a) for a in advantages)
            stats = train.grpo_update(model, optimizer, result, cfg)
            assert all(math.isfinite(v) for v in stats.values()), stats
            assert 0 < stats["entropy"] <= tiny_lm.MAX_ENTROPY + 1e-6
    with torch.no_grad():
        after = torch.softmax(model.action_logits(probe), -1)
    assert not torch.allclose(before, after, atol=1e-4)


def test_the_training_command_writes_its_figures(example, tmp_path: Path) -> None:
    train, _ = example
    flags = "--updates 4 --deals 4 --group 4 --eval-every 2 --eval-deals 60 --curve-deals 30".split()
    report = train.main([*flags, "--out", str(tmp_path)])

    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["greedy_after"] == report["greedy_after"]
    assert [p["update"] for p in saved["curve"]] == [0, 2, 4]
    assert saved["greedy_after"]["deals"] == 60
    assert {"random", "always_stand", saved["best_threshold"]} <= set(saved["baselines"])
    for figures in saved["baselines"].values():
        assert figures["win"] + figures["loss"] + figures["push"] == pytest.approx(1.0)
    assert len(saved["history"]) == 4 and all(math.isfinite(h["loss"]) for h in saved["history"])
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "model.pt").exists()
