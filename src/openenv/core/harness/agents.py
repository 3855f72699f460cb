"""How to point each agent CLI at the capture proxy: its command line, environment and config files.

Every harness is run unchanged; all it is told is a base URL and a key (a capture session's id),
plus what keeps it from phoning anywhere else (telemetry, update checks, model lists) and from
waiting for a human (approval prompts). The comments say what a harness does without each setting
(found by running each one with no network but a recording server).

``launch(name, base_url=..., api_key=..., model=..., task=..., executable=..., home=...)`` returns an
:class:`AgentLaunch`: write its ``files`` under the agent's ``HOME`` (e.g. a
:class:`~openenv.core.harness.process.HarnessSandbox`'s ``home`` directory), then run ``argv`` with
``env`` in the episode's workspace, its stdin at end of file (given the task as an argument, codex
and opencode still wait for stdin to end, and claude waits 3 s for it). The CLIs come from ``scripts/install-harnesses.sh``, which links
each one's command into ``$OPENENV_HARNESS_DIR/bin`` (see :func:`installed`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

__all__ = ["AgentLaunch", "HARNESSES", "Harness", "harness_dir", "installed", "launch"]


@dataclass(frozen=True)
class AgentLaunch:
    """One agent run: ``argv`` (``argv[0]`` the harness's executable), the variables to add to a
    clean environment, and files to write first, by path relative to ``HOME``."""

    harness: str
    dialect: str
    argv: List[str]
    env: Dict[str, str]
    files: Dict[str, str] = field(default_factory=dict)

    def write_files(self, home: os.PathLike) -> None:
        for relative, text in self.files.items():
            path = Path(home, relative)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


Builder = Callable[[str, str, str, str, str, str], AgentLaunch]


@dataclass(frozen=True)
class Harness:
    """A harness: its install name, the command linked in ``bin/``, the wire dialect it speaks (an
    :class:`~openenv.core.harness.capture.dialects.APIType` value), how it is installed (``npm``:
    node programs in ``npm/``; ``python``: a virtual environment ``venv-<name>``) and its launcher."""

    name: str
    command: str
    dialect: str
    kind: str
    build: Builder

    @property
    def install_command(self) -> str:
        """What installs it (``make test`` runs the ``npm`` one)."""
        return f"bash scripts/install-harnesses.sh {'npm' if self.kind == 'npm' else self.name}"

    def install_paths(self, root: os.PathLike) -> List[str]:
        """What a sandbox must show read-only for this harness to run from the install at ``root``."""
        # real paths: the executable (see :func:`installed`) is named by its real path too
        return [os.path.realpath(os.path.join(root, "npm" if self.kind == "npm" else f"venv-{self.name}"))]


def harness_dir(default: Optional[os.PathLike] = None) -> Path:
    """Where the harnesses are installed: ``$OPENENV_HARNESS_DIR``, else ``default`` (the install
    script's own default is ``<repo>/.harnesses``), else ``./.harnesses``."""
    chosen = os.environ.get("OPENENV_HARNESS_DIR", "").strip()
    return Path(chosen or default or ".harnesses").absolute()


def installed(name: str, root: os.PathLike) -> Optional[str]:
    """The real path of harness ``name``'s executable in the install at ``root``, or None when it is
    not installed there (the installer links only the commands that run)."""
    link = Path(root, "bin", HARNESSES[name].command)
    real = os.path.realpath(link)
    return real if os.path.isfile(real) and os.access(real, os.X_OK) else None


def launch(name: str, *, base_url: str, api_key: str, model: str, task: str, executable: str, home: str) -> AgentLaunch:
    """The run of harness ``name`` against the proxy at ``base_url`` (no trailing ``/v1``) with key
    ``api_key``, asking for ``model``, given ``task`` as its one prompt; ``home`` is the ``HOME``
    the agent will see (config files may name paths in it)."""
    return HARNESSES[name].build(base_url.rstrip("/"), api_key, model, task, executable, home)


# --- one launcher per harness ----------------------------------------------------------------------


def _codex(base_url: str, api_key: str, model: str, task: str, executable: str, home: str) -> AgentLaunch:
    # 0.171 ignores OPENAI_BASE_URL: only a custom provider moves it. Without web_search, plugins,
    # goals and agents disabled it sends non-function tools and calls api.github.com; without
    # supports_websockets=false it tries a Responses websocket first.
    config = "\n".join(
        [
            f"model = {json.dumps(model)}",
            'model_provider = "capture"',
            'web_search = "disabled"',
            "check_for_update_on_startup = false",
            "[model_providers.capture]",
            'name = "capture"',
            f"base_url = {json.dumps(base_url + '/v1')}",
            'env_key = "OPENAI_API_KEY"',
            'wire_api = "responses"',
            "supports_websockets = false",
            "request_max_retries = 0",
            "stream_max_retries = 0",
            "[analytics]",
            "enabled = false",
            "[feedback]",
            "enabled = false",
            "[features]",
            "plugins = false",
            "goals = false",
            "[agents]",
            "enabled = false",
            "",
        ]
    )
    # Its own sandbox (landlock + seccomp) cannot nest in ours: ours is the sandbox.
    argv = [executable, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", task]
    return AgentLaunch("codex", "openai_responses", argv, {"OPENAI_API_KEY": api_key}, {".codex/config.toml": config})


def _claude_code(base_url: str, api_key: str, model: str, task: str, executable: str, home: str) -> AgentLaunch:
    env = {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "IS_SANDBOX": "1",  # as root, --dangerously-skip-permissions refuses to run without it
    }
    # --bare --tools Bash: one tool and a short system prompt (~2 kB instead of ~48 kB).
    argv = [executable, "-p", "--bare", "--model", model, "--tools", "Bash", "--dangerously-skip-permissions", task]
    return AgentLaunch("claude-code", "anthropic", argv, env)


GEMINI_SYSTEM = "You are a coding agent. Use run_shell_command to act in the current directory."


def _gemini_cli(base_url: str, api_key: str, model: str, task: str, executable: str, home: str) -> AgentLaunch:
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}},  # else exit 41, "Invalid auth method"
        "privacy": {"usageStatisticsEnabled": False},  # else play.googleapis.com
        "telemetry": {"enabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        "tools": {"core": ["run_shell_command"]},  # one tool instead of 15
    }
    env = {
        "GEMINI_API_KEY": api_key,
        "GOOGLE_GEMINI_BASE_URL": base_url,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",  # else --yolo falls back to asking
        "GEMINI_SYSTEM_MD": f"{home}/.gemini/system.md",  # a short system prompt (the default is ~40 kB)
    }
    argv = [executable, "-p", task, "-m", model, "--yolo"]
    files = {".gemini/settings.json": json.dumps(settings), ".gemini/system.md": GEMINI_SYSTEM + "\n"}
    return AgentLaunch("gemini-cli", "google", argv, env, files)


OPENCODE_PROMPT = "You are a coding agent. Use the bash tool to act in the current directory."


def _opencode(base_url: str, api_key: str, model: str, task: str, executable: str, home: str) -> AgentLaunch:
    # Without the provider block it silently uses api.openai.com with OPENAI_API_KEY.
    config = {
        "autoupdate": False,
        "share": "disabled",
        "model": f"capture/{model}",
        "small_model": f"capture/{model}",
        "provider": {
            "capture": {
                "npm": "@ai-sdk/openai-compatible",  # built in: nothing is downloaded
                "name": "capture",
                "options": {"baseURL": base_url + "/v1", "apiKey": "{env:OPENAI_API_KEY}"},
                "models": {model: {"name": model}},
            }
        },
        # one tool and a short prompt, no separate title call: ~6 kB instead of ~31 kB
        "tools": {
            name: False for name in ("edit", "glob", "grep", "read", "skill", "task", "todowrite", "webfetch", "write")
        },
        "agent": {"build": {"prompt": OPENCODE_PROMPT}, "title": {"disable": True}},
    }
    env = {
        "OPENAI_API_KEY": api_key,
        "OPENCODE_CONFIG_CONTENT": json.dumps(config),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    }
    return AgentLaunch("opencode", "openai_chat", [executable, "run", task], env)


def _mini_swe_agent(base_url: str, api_key: str, model: str, task: str, executable: str, home: str) -> AgentLaunch:
    env = {
        "OPENAI_API_KEY": api_key,
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else it fetches the price map
    }
    argv = [
        executable, "-m", f"openai/{model}", "-t", task, "-y", "--exit-immediately", "-l", "0",
        "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={base_url}/v1",
        "-c", "agent.step_limit=4",  # the default, 0, is no limit
        "-o", "mini.traj.json",
    ]  # fmt: skip
    return AgentLaunch("mini-swe-agent", "openai_chat", argv, env)


def _smolagents(base_url: str, api_key: str, model: str, task: str, executable: str, home: str) -> AgentLaunch:
    # --tools with nothing after it: only final_answer (the default is a web search)
    argv = [
        executable, task, "--model-type", "OpenAIModel", "--model-id", model, "--api-base", f"{base_url}/v1",
        "--api-key", api_key, "--action-type", "tool_calling", "--tools",
    ]  # fmt: skip
    return AgentLaunch("smolagents", "openai_chat", argv, {})


def _aider(base_url: str, api_key: str, model: str, task: str, executable: str, home: str) -> AgentLaunch:
    env = {"OPENAI_API_KEY": api_key, "OPENAI_API_BASE": f"{base_url}/v1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    argv = [
        executable, "--message", task, "--model", f"openai/{model}", "--yes-always", "--no-git", "--no-check-update",
        "--no-show-release-notes", "--analytics-disable", "--no-auto-commits", "--no-pretty", "--no-fancy-input",
        "--no-show-model-warnings",
    ]  # fmt: skip
    # a seeded (empty) price map: else it downloads one
    return AgentLaunch(
        "aider-chat", "openai_chat", argv, env, {".aider/caches/model_prices_and_context_window.json": "{}"}
    )


HARNESSES: Dict[str, Harness] = {
    h.name: h
    for h in (
        Harness("codex", "codex", "openai_responses", "npm", _codex),
        Harness("claude-code", "claude", "anthropic", "npm", _claude_code),
        Harness("gemini-cli", "gemini", "google", "npm", _gemini_cli),
        Harness("opencode", "opencode", "openai_chat", "npm", _opencode),
        Harness("mini-swe-agent", "mini", "openai_chat", "python", _mini_swe_agent),
        Harness("smolagents", "smolagent", "openai_chat", "python", _smolagents),
        Harness("aider-chat", "aider", "openai_chat", "python", _aider),
    )
}
"""Every harness ``scripts/install-harnesses.sh`` installs, by its install name."""
