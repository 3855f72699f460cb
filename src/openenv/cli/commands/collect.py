"""``openenv collect``: play episodes of a served game or reasoning task and write them as a dataset.

Upstream OpenEnv 0.10's command: ``openenv collect openspiel:blackjack --base-url URL -o DIR``
plays ``-n`` episodes with a scripted player (the first legal action) or an LLM
(``--provider openai|anthropic``, or any OpenAI-compatible ``--llm-endpoint``), writes
``results.jsonl`` and ``metadata.json`` (:mod:`openenv.core.harness.collect`) and, with ``-H``,
pushes them to a Hugging Face dataset.

Where it differs from upstream: a key comes only from the variable that names the provider's
(``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``) or from ``--api-key-env NAME``, never from a generic
``API_KEY`` (which upstream sends to whatever endpoint it is pointed at); a resumed run keeps
``metadata.json`` as the first run wrote it, and refuses a directory whose episodes were made
with other settings (upstream rewrites the file on every run).

The names below are module globals looked up when the command runs, so a test or a wrapper may
substitute them, as upstream allows.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any, Callable, Dict, Optional

import typer

from openenv.cli._common import CLIError, err, out
from openenv.core.utils import shown_path

# name -> (module, attribute): imported when first used (the harness layers and the environment
# packages cost a tenth of a second that every other command would pay), then kept as a global of
# this module, so that a test or a wrapper can substitute any of them as upstream allows.
_LAZY = {
    "CollectRunner": ("openenv.core.harness.collect", "CollectRunner"),
    "RolloutSerializer": ("openenv.core.harness.collect", "RolloutSerializer"),
    "push_to_hf_hub": ("openenv.core.harness.collect", "push_to_hf_hub"),
    "MCPHarnessAdapter": ("openenv.core.harness.rollout", "MCPHarnessAdapter"),
    "create_llm_client": ("openenv.core.llm_client", "create_llm_client"),
    "OpenSpielSessionFactory": ("openenv.cli._collect_sessions", "OpenSpielSessionFactory"),
    "ReasoningGymSessionFactory": ("openenv.cli._collect_sessions", "ReasoningGymSessionFactory"),
    "OpenSpielEnv": ("openspiel_env", "OpenSpielEnv"),
    "ReasoningGymEnv": ("reasoning_gym_env", "ReasoningGymEnv"),
}
_OPTIONAL = ("openspiel_env", "reasoning_gym_env")
"""Environment packages: a missing one makes its names None (upstream's behaviour)."""


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    try:
        value = getattr(importlib.import_module(module), attribute)
    except ImportError:
        if module not in _OPTIONAL:
            raise
        value = None
    globals()[name] = value
    return value


def _g(name: str) -> Any:
    """The module global ``name`` as it is now (substituted, or imported on first use)."""
    return globals()[name] if name in globals() else __getattr__(name)


PROVIDERS = ("scripted", "openai", "anthropic")
KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
METADATA_RESUMABLE = ("num_episodes_requested",)
"""metadata.json keys that may change when a run is resumed (asking for more episodes)."""


def _build_llm_model_step(llm_client: Any, system_prompt: Optional[str] = None) -> Callable[..., Any]:
    from openenv.core.harness.collect import build_model_step

    return build_model_step(llm_client, system_prompt=system_prompt)


def _build_scripted_model_step() -> Callable[..., Any]:
    from openenv.cli._collect_sessions import build_scripted_model_step

    return build_scripted_model_step()


def _session_factory(env: str, base_url: str, dataset_config: Optional[str], system_prompt: Optional[str]) -> Any:
    kind, _, name = env.partition(":")
    if kind == "openspiel" and name:
        client_class, factory = _g("OpenSpielEnv"), _g("OpenSpielSessionFactory")
        if client_class is None or factory is None:
            raise CLIError("openspiel_env is not installed (pip install -e envs/openspiel_env)")
        return factory(lambda: client_class(base_url=base_url), game_name=name, system_prompt=system_prompt)
    if kind == "reasoning_gym" and name:
        client_class, factory = _g("ReasoningGymEnv"), _g("ReasoningGymSessionFactory")
        if client_class is None or factory is None:
            raise CLIError("reasoning_gym_env is not installed (pip install -e envs/reasoning_gym_env)")
        config: Dict[str, Any] = {}
        if dataset_config:
            try:
                config = json.loads(dataset_config)
            except ValueError as exc:
                raise typer.BadParameter(f"not JSON: {exc}", param_hint="--dataset-config") from None
            if not isinstance(config, dict):
                raise typer.BadParameter("must be a JSON object", param_hint="--dataset-config")
        return factory(
            lambda: client_class(base_url=base_url),
            dataset_name=name,
            dataset_config=config,
            system_prompt=system_prompt,
        )
    raise typer.BadParameter(
        f"{env!r}: collect plays openspiel:<game> (openspiel:blackjack) or reasoning_gym:<dataset>"
        " (reasoning_gym:leg_counting); for any other environment use openenv eval",
        param_hint="ENV",
    )


def _llm_client(
    provider: str,
    model: Optional[str],
    endpoint: Optional[str],
    port: Optional[int],
    api_key_env: Optional[str],
    temperature: float,
    max_tokens: int,
) -> Any:
    if not model:
        raise typer.BadParameter(f"--provider {provider} needs --model", param_hint="--model")
    variable = api_key_env or (None if endpoint else KEY_VARIABLES[provider])
    key = os.environ.get(variable) if variable else None
    if variable and api_key_env and not key:
        raise CLIError(f"--api-key-env {variable}: that variable is not set")
    if endpoint:
        if provider != "openai":
            raise typer.BadParameter("--llm-endpoint speaks the OpenAI API: use --provider openai")
        from openenv.core.llm_client import OpenAIClient

        return OpenAIClient(endpoint, port, model=model, api_key=key, temperature=temperature, max_tokens=max_tokens)
    if not key:
        raise CLIError(f"--provider {provider} needs a key in {variable} (or name another with --api-key-env)")
    return _g("create_llm_client")(provider, model, key, temperature=temperature, max_tokens=max_tokens)


def register(app: typer.Typer) -> None:
    @app.command("collect")
    def collect(
        env: str = typer.Argument(
            ..., metavar="ENV", help="openspiel:<game> (openspiel:blackjack) or reasoning_gym:<dataset>."
        ),
        base_url: str = typer.Option(..., "--base-url", metavar="URL", help="The environment's server."),
        output_dir: str = typer.Option(
            ..., "--output-dir", "-o", metavar="DIR", help="Where results.jsonl and metadata.json go."
        ),
        num_episodes: int = typer.Option(10, "--num-episodes", "-n", min=0, metavar="N", help="Episodes to play."),
        max_turns: int = typer.Option(9, "--max-turns", min=1, metavar="N", help="Model turns per episode."),
        episode_id_prefix: str = typer.Option(
            "ep", "--episode-id-prefix", metavar="PREFIX", help="Episode ids are PREFIX-000000, PREFIX-000001, ..."
        ),
        resume: bool = typer.Option(
            True,
            "--resume/--no-resume",
            metavar="",
            help="Skip the episodes DIR has (default), or move its results aside and start over.",
        ),
        provider: str = typer.Option(
            "scripted", "--provider", metavar="NAME", help="scripted (the first legal action), openai or anthropic."
        ),
        model: Optional[str] = typer.Option(None, "--model", metavar="NAME", help="The model (with an LLM provider)."),
        llm_endpoint: Optional[str] = typer.Option(
            None, "--llm-endpoint", metavar="URL", help="An OpenAI-compatible endpoint (vLLM, SGLang, ...)."
        ),
        llm_port: Optional[int] = typer.Option(None, "--llm-port", metavar="PORT", help="The endpoint's port."),
        api_key_env: Optional[str] = typer.Option(
            None,
            "--api-key-env",
            metavar="NAME",
            help="The variable holding the model's key (default: OPENAI_API_KEY or ANTHROPIC_API_KEY for those "
            "providers; none for --llm-endpoint).",
        ),
        temperature: float = typer.Option(0.2, "--temperature", metavar="T", help="Sampling temperature."),
        max_tokens: int = typer.Option(200, "--max-tokens", min=1, metavar="N", help="Tokens per model turn."),
        keep_losses: bool = typer.Option(
            False, "--keep-losses", metavar="", help="Keep every episode (default: those with a reward >= 0)."
        ),
        push_to_hub: Optional[str] = typer.Option(
            None, "--push-to-hub", "-H", metavar="REPO", help="Then upload DIR to this Hugging Face dataset."
        ),
        private: bool = typer.Option(False, "--private", metavar="", help="Make a new dataset private."),
        commit_message: Optional[str] = typer.Option(None, "--commit-message", metavar="TEXT", help="Of the upload."),
        dataset_config: Optional[str] = typer.Option(
            None, "--dataset-config", metavar="JSON", help="reasoning_gym: the dataset's config, as JSON."
        ),
        system_prompt: Optional[str] = typer.Option(
            None, "--system-prompt", metavar="TEXT", help="The system message the model gets."
        ),
    ) -> None:
        """Play episodes of a game or reasoning task and write them as a dataset (upstream's collect).

        Writes DIR/results.jsonl (one episode a line: messages, reward, tool trace, metrics) and DIR/metadata.json. Keys come from OPENAI_API_KEY / ANTHROPIC_API_KEY or --api-key-env, never from API_KEY. For any environment, with a report: openenv eval.
        """
        if provider not in PROVIDERS:
            raise typer.BadParameter(f"{provider!r} is not one of {', '.join(PROVIDERS)}", param_hint="--provider")
        factory = _session_factory(env, base_url, dataset_config, system_prompt)
        if provider == "scripted":
            model_step = _build_scripted_model_step()
        else:
            client = _llm_client(provider, model, llm_endpoint, llm_port, api_key_env, temperature, max_tokens)
            model_step = _build_llm_model_step(client, system_prompt)
        metadata = {
            "env": env,
            "env_base_url": base_url,
            "provider": "openai-compatible" if llm_endpoint and provider != "scripted" else provider,
            "model": model,
            "llm_endpoint": llm_endpoint,
            "llm_port": llm_port,
            "num_episodes_requested": num_episodes,
            "temperature": temperature,
            "keep_losses": keep_losses,
        }
        from openenv.core.harness.rollout import HarnessRunLimits

        serializer = _g("RolloutSerializer")(output_dir)
        if resume:
            try:
                serializer.ensure_metadata(metadata, ignore=METADATA_RESUMABLE)
            except ValueError as exc:
                raise CLIError(f"{exc}; collect into another --output-dir, or start over with --no-resume") from None
        runner = _g("CollectRunner")(
            session_factory=factory,
            harness_adapter=_g("MCPHarnessAdapter")(),
            serializer=serializer,
            limits=HarnessRunLimits(
                max_turns=max_turns, sampling={"temperature": temperature, "max_tokens": max_tokens}
            ),
        )
        if not resume:
            moved = serializer.backup_results()
            if moved is not None:
                err.print(f"Moved the earlier results to {shown_path(moved)}")
            serializer.write_metadata(metadata)
        keep = None if keep_losses else (lambda record: record.reward is not None and record.reward >= 0)
        with err.status(f"Collecting {num_episodes} episodes of {env}..."):
            result = runner.run(
                model_step=model_step,
                num_episodes=num_episodes,
                episode_id_prefix=episode_id_prefix,
                resume=True,  # (without --resume the earlier results were moved aside above)
                should_keep=keep,
            )
        err.print(
            f"Collected {result.num_collected} episodes ({result.num_skipped} on disk already, "
            f"{result.num_dropped} dropped, {result.num_failed} failed); mean reward {result.avg_reward:.3g}, "
            f"success rate {100 * result.success_rate:.1f}%"
        )
        out.print(shown_path(serializer.results_path))
        if push_to_hub:
            try:
                url = _g("push_to_hf_hub")(
                    output_dir=output_dir, repo_id=push_to_hub, private=private, commit_message=commit_message
                )
            except (ImportError, FileNotFoundError) as exc:
                raise CLIError(str(exc)) from None
            err.print(f"Pushed to {url}")
        if result.num_failed and not result.num_collected and not result.num_skipped:
            raise CLIError(f"all {result.num_failed} episodes failed (the log above says why)")
