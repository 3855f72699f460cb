"""openenv.core.env_server.web_interface (OpenEnv 0.10's module) and a package's own Gradio UI
mounted beside the playground.

``fixtures/web_packages/notes_env`` is a package shaped as upstream's are: its ``server/app.py``
imports ``create_web_interface_app`` and ``load_environment_metadata`` from ``web_interface`` and
makes its app at import, with a ``gradio_builder``. The browser tests use Debian's Chromium as
tests/test_web.py does; the Gradio tests skip, saying why, where Gradio is not installed
(``pip install 'openenv[gradio]'``).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import httpx
import pytest
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from pydantic import Field

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from openenv.core.env_server.web_interface import (
    WebInterfaceManager,
    _extract_action_fields,
    _is_chat_env,
    create_web_interface_app,
    get_quick_start_markdown,
    load_environment_metadata,
)

from .conftest import serve
from .test_web import by_css, by_id, chromium_windows, console_errors, load, reset, wait_for

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "tests" / "fixtures" / "web_packages"
NOTES_README = PACKAGES / "notes_env" / "README.md"
TOKEN = "web-interface-token-0123456789"


class GuessIt(Action):
    number: int = Field(ge=0, le=100, description="your guess")


class Guessed(Observation):
    text: str = ""


class Guess(Environment[GuessIt, Guessed, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Guessed:
        self._state = State(episode_id=episode_id or f"guess-{seed}", step_count=0)
        return Guessed(text="guess a number")

    def step(self, action: GuessIt, timeout_s: Optional[float] = None, **kwargs: Any) -> Guessed:
        self._state.step_count += 1
        return Guessed(text=f"you said {action.number}", reward=float(action.number == 42), done=action.number == 42)

    @property
    def state(self) -> State:
        return self._state


class Closing(Guess):
    """Says when it is closed."""

    closed: List[str] = []

    def close(self) -> None:
        self.closed.append("closed")


def _gradio_missing() -> Optional[str]:
    try:
        import gradio  # noqa: F401
    except ImportError:
        return "Gradio is not installed (pip install 'openenv[gradio]')"
    return None


needs_gradio = pytest.mark.skipif(_gradio_missing() is not None, reason=str(_gradio_missing()))


@pytest.fixture
def browser() -> Iterator[Callable[..., Any]]:
    with chromium_windows() as open_window:
        yield open_window


@pytest.fixture
def notes_app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The notes package's app, imported afresh as a server imports it (``ENV_README_PATH`` naming
    its README, as its Dockerfile would), and the record of what its builder was given."""
    monkeypatch.syspath_prepend(str(PACKAGES))
    monkeypatch.setenv("ENV_README_PATH", str(NOTES_README))
    for name in [m for m in sys.modules if m == "notes_env" or m.startswith("notes_env.")]:
        monkeypatch.delitem(sys.modules, name)
    module = importlib.import_module("notes_env.server.app")
    yield module.app
    for name in [m for m in sys.modules if m == "notes_env" or m.startswith("notes_env.")]:
        sys.modules.pop(name, None)


def builder_calls() -> List[Dict[str, Any]]:
    return importlib.import_module("notes_env.server.gradio_ui").BUILT


# --- an upstream-shaped package ---------------------------------------------------------------------


def test_an_upstream_shaped_package_imports_and_plays_in_the_page(notes_app: Any, browser: Any) -> None:
    """The package's app (made at import through web_interface) serves the playground: its README
    (found through load_environment_metadata), a reset, a step by clicking one of its web_actions,
    and the same call in Python is the action the button sent."""
    with serve(notes_app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        assert by_id(driver, "readme").get_attribute("textContent").startswith("# Notes environment")
        reset(driver, seed=1)
        buttons = {b.text: b for b in by_css(driver, "#web-actions button")}
        buttons["pin bye"].click()
        wait_for(driver, lambda d: len(by_css(d, "#log tbody tr")) == 2)
        assert "BYE" in by_id(driver, "observation").text and by_id(driver, "reward").text == "3"
        assert 'env.step({"text": "bye", "pin": True})' in by_id(driver, "snippet").text
        assert console_errors(driver) == []


@needs_gradio
def test_the_packages_gradio_ui_answers_under_its_mount_and_the_page_links_to_it(notes_app: Any, browser: Any) -> None:
    """With Gradio installed the builder is called as upstream calls it, its UI is served at
    /web/custom/ (linked from the page as the package's custom_tab_name) and plays the one shared
    environment that existed while it was built."""
    (call,) = builder_calls()
    assert call["title"] == "OpenEnv Agentic Environment: notes_env" and call["chat"] is False
    assert [f["name"] for f in call["fields"]] == ["text", "pin"]
    assert isinstance(call["metadata"], EnvironmentMetadata) and call["metadata"].name == "notes_env"
    assert "from notes_env import NotesEnv" in call["quick_start"]
    manager = notes_app.state.openenv_web_manager
    with serve(notes_app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        link = by_id(driver, "custom-link")
        assert link.is_displayed() and link.text == "Notes"
        link.click()
        wait_for(driver, lambda d: by_css(d, "#write-button"), timeout=60)
        assert driver.current_url == server.base_url + "/web/custom/"
        assert "Notes are kept until the next reset." in by_id(driver, "notes-greeting").text
        by_id(driver, "restart-button").click()
        wait_for(driver, lambda d: manager.episode_state.episode_id is not None)
        by_css(driver, "#note-input textarea, #note-input input")[0].send_keys("from gradio")
        by_id(driver, "write-button").click()
        output = "#notes-output textarea"
        wait_for(driver, lambda d: "(reward 11.0)" in by_css(d, output)[0].get_attribute("value"), timeout=30)
        assert by_css(driver, output)[0].get_attribute("value").startswith("from gradio")
    assert manager.episode_state.step_count == 1
    assert manager.episode_state.action_logs[0].action == {"text": "from gradio", "pin": False}


@needs_gradio
def test_build_gradio_app_is_a_builder_that_plays_the_environment(browser: Any) -> None:
    """web_interface's build_gradio_app (upstream's Gradio playground) takes a builder's arguments:
    mounted as a gradio_builder, its Reset, action form and Step play the shared environment."""
    from openenv.core.env_server.web_interface import build_gradio_app

    app = create_web_interface_app(Guess, GuessIt, Guessed, env_name="guess", gradio_builder=build_gradio_app)
    with serve(app) as server:
        driver = browser()
        driver.get(server.base_url + "/web/custom/")
        wait_for(driver, lambda d: by_css(d, "#openenv-step"), timeout=60)
        assert driver.title == "OpenEnv Agentic Environment: guess"
        by_id(driver, "openenv-reset").click()
        wait_for(driver, lambda d: "running" in by_id(d, "openenv-status").text, timeout=30)
        number = by_css(driver, "#openenv-field-number input")[0]
        number.clear()
        number.send_keys("42")
        by_id(driver, "openenv-step").click()
        wait_for(driver, lambda d: "done" in by_id(d, "openenv-status").text, timeout=30)
        assert "reward 1" in by_id(driver, "openenv-status").text.replace("*", "")
        assert "you said 42" in by_id(driver, "openenv-observation").text


# --- the Gradio mount's edges ------------------------------------------------------------------------


def _builder(seen: List[Any]) -> Callable[..., Any]:
    def build(web_manager: Any, action_fields: Any, metadata: Any, is_chat_env: Any, title: Any, quick: Any) -> Any:
        import gradio as gr

        seen.append(web_manager)
        with gr.Blocks() as ui:
            gr.Markdown("custom")
        return ui

    return build


@needs_gradio
def test_the_gradio_mount_is_behind_the_token_and_the_origin_check_and_not_framed() -> None:
    app = create_web_interface_app(
        Guess, GuessIt, Guessed, env_name="guess", gradio_builder=_builder([]), auth_token=TOKEN
    )
    with serve(app) as server, httpx.Client(base_url=server.base_url) as http:
        refused = http.get("/web/custom/")
        assert refused.status_code == 401 and refused.json()["code"] == "UNAUTHORIZED"
        assert http.get("/web/custom/config").status_code == 401
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        page = http.get("/web/custom/", headers=bearer)
        assert page.status_code == 200 and page.headers["x-frame-options"] == "DENY"  # no site may frame it
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        join = http.post(
            "/web/custom/gradio_api/queue/join",
            json={"data": [], "fn_index": 0, "session_hash": "x"},
            headers={**bearer, "Origin": "http://evil.example"},
        )
        assert join.status_code == 403  # a page of another site, token or not
        assert http.get("/web/metadata", headers=bearer).json()["custom"] == {
            "name": "Custom",
            "path": "custom/",
            "primary": False,
        }


@needs_gradio
@pytest.mark.parametrize("options", [{"custom_tab_primary": True}, {"show_default_tab": False}])
def test_a_primary_custom_tab_is_where_the_server_opens(options: Dict[str, Any]) -> None:
    app = create_web_interface_app(Guess, GuessIt, Guessed, gradio_builder=_builder([]), **options)
    with serve(app) as server:
        for path in ("/", "/web"):
            assert httpx.get(server.base_url + path).headers["location"] == "web/custom/"
        assert httpx.get(server.base_url + "/web/").status_code == 200  # the playground is still there


@needs_gradio
def test_a_builder_that_returns_no_blocks_is_refused_and_its_environment_closed() -> None:
    with pytest.raises(TypeError, match=r"gradio_builder must return a gradio\.Blocks, not str"):
        create_web_interface_app(Closing, GuessIt, Guessed, gradio_builder=lambda *args: "<h1>ui</h1>")
    assert Closing.closed == ["closed"]


@needs_gradio
def test_a_builder_is_not_called_without_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """As upstream: create_app mounts a builder only where the web interface is on."""
    from openenv.core.env_server.http_server import create_app

    seen: List[Any] = []
    create_app(Guess, GuessIt, Guessed, gradio_builder=_builder(seen))
    assert seen == []
    monkeypatch.setenv("ENABLE_WEB_INTERFACE", "1")
    create_app(Guess, GuessIt, Guessed, gradio_builder=_builder(seen))
    assert len(seen) == 1 and isinstance(seen[0], WebInterfaceManager)
    asyncio.run(seen[0].close())  # (never served: no shutdown closes it)


def _run(script: str) -> Dict[str, Any]:
    """``script`` in a fresh interpreter (repository root, the fixture packages importable);
    its last stdout line is JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(PACKAGES), "PATH": "/usr/bin:/bin", "ENV_README_PATH": str(NOTES_README)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


_NO_GRADIO = """
    import importlib.abc, sys

    class NoGradio(importlib.abc.MetaPathFinder):  # as if openenv[gradio] were not installed
        def find_spec(self, name, path=None, target=None):
            if name == "gradio" or name.startswith("gradio."):
                raise ModuleNotFoundError("No module named 'gradio'", name="gradio")
            return None

    sys.meta_path.insert(0, NoGradio())
"""


def test_without_gradio_the_page_is_served_alone_and_one_line_says_how_to_get_the_ui() -> None:
    result = _run(
        _NO_GRADIO
        + """
    import json, sys, httpx
    from notes_env.server.app import app
    from notes_env.server.gradio_ui import BUILT
    from openenv.core.env_server.serving.runner import BackgroundServer

    with BackgroundServer(app) as server:
        page = httpx.get(server.base_url + "/web/").status_code
        custom = httpx.get(server.base_url + "/web/custom/").status_code
        about = httpx.get(server.base_url + "/web/metadata").json()
    print(json.dumps({"page": page, "custom": custom, "link": about["custom"], "built": len(BUILT),
                      "gradio": "gradio" in sys.modules}))
    """
    )
    assert (result["page"], result["custom"], result["link"], result["built"]) == (200, 404, None, 0)
    assert result["gradio"] is False
    notices = [line for line in result["stderr"].splitlines() if "gradio_builder" in line]
    assert len(notices) == 1 and "pip install 'openenv[gradio]'" in notices[0] and "/web/custom/" in notices[0]


def test_without_gradio_its_names_say_how_to_install_it_and_the_rest_imports() -> None:
    result = _run(
        _NO_GRADIO
        + """
    import json
    from openenv.core.env_server.web_interface import create_web_interface_app, load_environment_metadata
    try:
        from openenv.core.env_server.web_interface import build_gradio_app
    except ImportError as exc:
        ui = str(exc)
    try:
        from openenv.core.env_server.gradio_theme import OPENENV_GRADIO_THEME
    except ImportError as exc:
        theme = str(exc)
    print(json.dumps({"ui": ui, "theme": theme}))
    """
    )
    assert "pip install 'openenv[gradio]'" in result["ui"] and "gradio_ui needs Gradio" in result["ui"]
    assert "pip install 'openenv[gradio]'" in result["theme"]


def test_gradio_is_never_imported_unless_a_builder_is_given() -> None:
    result = _run(
        """
    import json, sys
    from openenv.core.env_server import web_interface, WebInterfaceManager
    from notes_env.models import NoteAction, NoteObservation
    from notes_env.server.notes_environment import NotesEnvironment

    web_interface.create_web_interface_app(NotesEnvironment, NoteAction, NoteObservation, max_concurrent_envs=2)
    print(json.dumps({"gradio": "gradio" in sys.modules}))
    """
    )
    assert result["gradio"] is False


# --- load_environment_metadata ------------------------------------------------------------------------


class Described(Guess):
    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="described", description="its own words", readme_content=None)


def make_guess(level: int = 1) -> Guess:
    return Guess()


def test_an_instance_describes_itself_and_no_readme_is_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENV_README_PATH", str(NOTES_README))
    metadata = load_environment_metadata(Described(), env_name="ignored")
    assert (metadata.name, metadata.description, metadata.readme_content) == ("described", "its own words", None)


@pytest.mark.parametrize(
    "factory, name",
    [(Guess, "Guess"), (make_guess, "make_guess"), (functools.partial(make_guess, level=2), "make_guess")],
    ids=["class", "function", "partial"],
)
def test_a_factory_is_described_without_being_called(
    factory: Any, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no envs/ here, nor /app in a test machine
    monkeypatch.delenv("ENV_README_PATH", raising=False)
    metadata = load_environment_metadata(factory)
    assert metadata.model_dump() == {
        "name": name,
        "description": f"{name} environment",
        "readme_content": None,
        "version": "1.0.0",
        "author": None,
        "documentation_url": None,
    }
    assert load_environment_metadata(factory, env_name="guess_env").name == "guess_env"


def test_the_readme_is_env_readme_path_first_then_envs_env_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "envs" / "guess_env").mkdir(parents=True)
    (tmp_path / "envs" / "guess_env" / "README.md").write_text("# from envs/")
    monkeypatch.delenv("ENV_README_PATH", raising=False)
    assert load_environment_metadata(Guess, "guess_env").readme_content == "# from envs/"
    assert load_environment_metadata(Guess).readme_content is None  # envs/<name> only with an env_name
    monkeypatch.setenv("ENV_README_PATH", str(NOTES_README))
    assert load_environment_metadata(Guess, "guess_env").readme_content.startswith("# Notes environment")
    monkeypatch.setenv("ENV_README_PATH", str(tmp_path / "missing.md"))  # unreadable: the next place
    assert load_environment_metadata(Guess, "guess_env").readme_content == "# from envs/"


# --- what a builder is told ---------------------------------------------------------------------------


class Kinds(Action):
    name: str
    message: str = ""
    source_code: Optional[str] = None
    essay: str = Field("", max_length=500)
    count: int = Field(3, ge=1, le=9)
    ratio: float = 0.5
    flag: bool = True
    mode: str = Field("fast", json_schema_extra={"enum": ["fast", "slow"]})
    input_tokens: List[int] = Field(default_factory=list)


def test_action_fields_have_upstreams_keys_and_kinds() -> None:
    fields = {f["name"]: f for f in _extract_action_fields(Kinds)}
    assert "metadata" not in fields
    kinds = {name: f["type"] for name, f in fields.items()}
    assert kinds == {
        "name": "text",
        "message": "textarea",
        "source_code": "textarea",
        "essay": "textarea",
        "count": "number",
        "ratio": "number",
        "flag": "checkbox",
        "mode": "select",
        "input_tokens": "tensor",
    }
    assert fields["name"]["required"] is True and fields["count"]["required"] is False
    assert (fields["count"]["min_value"], fields["count"]["max_value"], fields["count"]["default_value"]) == (1, 9, 3)
    assert fields["mode"]["choices"] == ["fast", "slow"] and fields["essay"]["max_length"] == 500
    assert set(fields["name"]) == {
        "name",
        "type",
        "required",
        "description",
        "default_value",
        "choices",
        "min_value",
        "max_value",
        "min_length",
        "max_length",
        "pattern",
        "placeholder",
        "help_text",
    }


def test_a_chat_environment_has_tensor_tokens() -> None:
    class Tensor:  # what the annotation's name says (torch.Tensor); torch is not imported to tell
        pass

    class Chat(Action):
        model_config = {"arbitrary_types_allowed": True}
        tokens: Tensor

    assert _is_chat_env(Chat) is True
    assert _is_chat_env(Kinds) is False and _is_chat_env(GuessIt) is False


def test_the_quick_start_names_the_packages_client_and_the_space(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PACKAGES))
    from notes_env.models import NoteAction, NoteObservation

    metadata = EnvironmentMetadata(name="notes_env", description="notes")
    local = get_quick_start_markdown(metadata, NoteAction, NoteObservation)
    assert "from notes_env import NotesEnv" in local and 'NotesEnv(base_url="http://localhost:8000")' in local
    assert "pip install" not in local
    monkeypatch.setenv("SPACE_HOST", "someone-notes.hf.space")
    monkeypatch.setenv("SPACE_ID", "someone/notes")
    spaced = get_quick_start_markdown(metadata, NoteAction, NoteObservation)
    assert 'base_url="https://someone-notes.hf.space"' in spaced
    assert "pip install git+https://huggingface.co/spaces/someone/notes" in spaced


def test_the_quick_start_of_an_action_without_a_package_uses_the_generic_client() -> None:
    Loose = type("Loose", (Action,), {"__module__": "__main__", "__annotations__": {"x": int}})
    snippet = get_quick_start_markdown(None, Loose, Observation)
    assert "from openenv import GenericEnvClient" in snippet


# --- WebInterfaceManager --------------------------------------------------------------------------------


class AsyncOnly(Guess):
    """Answers on the event loop only (its sync calls fail): the manager must await these."""

    def reset(self, *args: Any, **kwargs: Any) -> Guessed:
        raise RuntimeError("sync reset called")

    def step(self, *args: Any, **kwargs: Any) -> Guessed:
        raise RuntimeError("sync step called")

    async def reset_async(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Guessed:
        return Guess.reset(self, seed=seed, episode_id=episode_id)

    async def step_async(self, action: GuessIt, timeout_s: Optional[float] = None, **kwargs: Any) -> Guessed:
        return Guess.step(self, action)


@pytest.mark.parametrize("env", [Guess, AsyncOnly], ids=["sync", "async"])
def test_the_manager_plays_one_shared_episode_and_logs_it(env: Any) -> None:
    async def play() -> WebInterfaceManager:
        manager = WebInterfaceManager(env, GuessIt, Guessed)
        first = await manager.reset_environment({"seed": 7, "not_a_reset_keyword": 1})
        assert first == {"observation": {"text": "guess a number", "metadata": {}}, "reward": None, "done": False}
        for number in (3, 42):
            answer = await manager.step_environment({"number": number})
        assert answer["done"] is True and answer["reward"] == 1.0
        assert manager.get_state() == {"episode_id": "guess-7", "step_count": 2}
        await manager.close()
        return manager

    manager = asyncio.run(play())
    episode = manager.episode_state
    assert (episode.episode_id, episode.step_count, episode.is_reset) == ("guess-7", 2, False)
    assert [log.action for log in episode.action_logs] == [{"number": 3}, {"number": 42}]
    assert (
        episode.current_observation == {"text": "you said 42", "metadata": {}} and episode.action_logs[1].done is True
    )
    assert manager.metadata.name == type(manager.env).__name__  # an instance's own get_metadata


def test_the_manager_keeps_the_latest_thousand_steps_and_refuses_a_bad_action() -> None:
    import pydantic

    async def play() -> WebInterfaceManager:
        manager = WebInterfaceManager(Guess(), GuessIt, Guessed)
        await manager.reset_environment()
        for _ in range(manager.MAX_ACTION_LOGS + 5):
            await manager.step_environment({"number": 1})
        with pytest.raises(pydantic.ValidationError):
            await manager.step_environment({"number": 500})
        await manager.close()
        return manager

    episode = asyncio.run(play()).episode_state
    assert episode.step_count == 1005 and len(episode.action_logs) == 1000
    assert episode.action_logs[0].step_count == 6


def test_ui_sockets_get_the_episode_on_connect_and_after_each_call() -> None:
    """Served for real: a /ws/ui-style route of a package's own, a websockets client watching."""
    from websockets.sync.client import connect

    manager = WebInterfaceManager(Guess, GuessIt, Guessed)
    app = FastAPI()

    @app.websocket("/ws/ui")
    async def ui(websocket: WebSocket) -> None:
        await manager.connect_websocket(websocket)
        try:
            while True:
                await websocket.receive_text()
        except WebSocketDisconnect:
            await manager.disconnect_websocket(websocket)

    @app.post("/play")
    async def play() -> Dict[str, Any]:
        await manager.reset_environment({"seed": 1})
        return await manager.step_environment({"number": 5})

    with serve(app) as server, connect(server.base_url.replace("http", "ws") + "/ws/ui") as socket:
        hello = json.loads(socket.recv(timeout=10))
        assert hello["type"] == "state_update" and hello["episode_state"]["is_reset"] is True
        assert httpx.post(server.base_url + "/play").json()["observation"]["text"] == "you said 5"
        after_reset, after_step = json.loads(socket.recv(timeout=10)), json.loads(socket.recv(timeout=10))
        assert after_reset["episode_state"]["episode_id"] == "guess-1"
        assert after_step["episode_state"]["step_count"] == 1
        assert after_step["episode_state"]["action_logs"][0]["action"] == {"number": 5}
