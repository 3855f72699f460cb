"""The web playground (openenv.core.env_server.web) in a real headless Chromium, and its routes over HTTP.

The browser is Debian's ``chromium`` driven by its ``chromedriver`` through Selenium (``make test``
installs both: scripts/install-browser.sh); without them the browser tests skip, saying why.
Screenshots go to ``$OPENENV_WEB_SHOTS`` when set, else to the test's tmp directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional

import httpx
import pytest
from pydantic import Field

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from .conftest import serve

TOKEN = "web-playground-token-0123456789"


class GuessAction(Action):
    number: int = Field(ge=0, le=100, description="your guess")
    hint: Literal["none", "warm"] = "none"
    note: Optional[str] = None


class GuessObservation(Observation):
    text: str = ""
    picture: List[List[int]] = Field(default_factory=list)
    badge: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    """Guess 42. Reward: 1 for 42, else minus the distance / 100. Observations carry a 2-D array
    (drawn as an image) and a data: image."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    BADGE = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, level: int = 1) -> GuessObservation:
        self._state = State(episode_id=episode_id or f"episode-{seed}-{id(self)}", step_count=0)
        return GuessObservation(text=f"level {level}: guess a number <b>0-100</b>", picture=[[0, 255], [255, 0]])

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        hit = action.number == 42
        reward = 1.0 if hit else -abs(action.number - 42) / 100
        return GuessObservation(
            text=f"you said {action.number}",
            done=hit,
            reward=reward,
            picture=[[action.number] * 3] * 3,
            badge=self.BADGE,
        )

    @property
    def state(self) -> State:
        return self._state


class HostileEnv(GuessEnv):
    """Its render_web HTML tries to run code in the page and to reach the server."""

    def render_web(self, observation: dict) -> Optional[str]:
        return (
            "<p id='drawn'>drawn by render_web</p>"
            "<script>parent.document.title = 'pwned'; fetch('/web/pwned-script');</script>"
            "<img src='/web/pwned-image'><img src='x' onerror=\"parent.document.title='pwned'\">"
            "<form action='/web/pwned-form'><button id='go'>go</button></form>"
            "<a href='javascript:parent.document.title=1'>link</a>"
        )

    def web_actions(self, observation: dict) -> List[tuple]:
        return [("guess 42", {"number": 42}), ("guess 7", {"number": 7})]


def guess_app(env: Any = GuessEnv, **kwargs: Any) -> Any:
    kwargs.setdefault("max_concurrent_envs", 4)
    kwargs.setdefault("web", True)
    return create_app(env, GuessAction, GuessObservation, env_name="guess", **kwargs)


class Recorder:
    """ASGI wrapper keeping every request's path and query string (to show what the page sent)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: List[str] = []
        self.headers: List[Dict[bytes, bytes]] = []

    async def __call__(self, scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            self.seen.append(scope["path"] + "?" + scope.get("query_string", b"").decode())
            self.headers.append(dict(scope.get("headers", ())))
        await self.app(scope, receive, send)


# --- the browser -----------------------------------------------------------------------------------


def _browser_missing() -> Optional[str]:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'openenv[dev]')"
    for tool in ("chromium", "chromedriver"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test installs it: scripts/install-browser.sh)"
    return None


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("OPENENV_WEB_SHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


@contextlib.contextmanager
def chromium_windows() -> Iterator[Callable[..., Any]]:
    """Opens headless Chromium windows (each its own profile: a visitor); closes them after.
    Skips the test, saying why, where there is no browser."""
    missing = _browser_missing()
    if missing:
        pytest.skip(f"no browser for the web playground tests: {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opened: List[Any] = []

    def open_window(*flags: str) -> Any:
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")  # the system's: Selenium downloads nothing
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", *flags):
            options.add_argument(flag)
        options.add_argument("--window-size=1300,1100")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        opened.append(driver)
        return driver

    try:
        yield open_window
    finally:
        for driver in opened:
            with contextlib.suppress(Exception):
                driver.quit()


@pytest.fixture
def browser() -> Iterator[Callable[..., Any]]:
    """Headless Chromium windows for a test (:func:`chromium_windows`)."""
    with chromium_windows() as open_window:
        yield open_window


def wait_for(driver: Any, condition: Callable[[Any], Any], timeout: float = 15.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def by_id(driver: Any, name: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, name)


def by_css(driver: Any, selector: str) -> List[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def console_errors(driver: Any, allowed: tuple = ()) -> List[str]:
    """The browser log's errors, but for failed loads with an expected status (``allowed``)."""
    errors = []
    for entry in driver.get_log("browser"):
        if entry["level"] != "SEVERE":
            continue
        if entry.get("source") == "network" and any(f"status of {code}" in entry["message"] for code in allowed):
            continue
        errors.append(entry["message"])
    return errors


def load(driver: Any, url: str) -> None:
    driver.get(url)
    wait_for(driver, lambda d: by_id(d, "reset-button").is_enabled())


def reset(driver: Any, seed: Optional[int] = None) -> None:
    if seed is not None:
        by_id(driver, "seed").clear()
        by_id(driver, "seed").send_keys(str(seed))
    before = len(by_css(driver, "#log tbody tr"))
    by_id(driver, "reset-button").click()
    wait_for(driver, lambda d: by_id(d, "done").text in ("running", "done") and not by_id(d, "error").is_displayed())
    wait_for(driver, lambda d: by_id(d, "step-button").is_enabled())
    del before


def fill(driver: Any, name: str, value: Any) -> None:
    field = by_css(driver, f'#action-fields [name="{name}"]')[0]
    field.clear()
    field.send_keys(str(value))


def step(driver: Any) -> None:
    rows = len(by_css(driver, "#log tbody tr"))
    by_id(driver, "step-button").click()
    wait_for(driver, lambda d: len(by_css(d, "#log tbody tr")) > rows or by_id(d, "error").is_displayed())


def server_of(app: Any) -> Any:
    return app.state.openenv_server


def sessions_made(manager: Any, monkeypatch: Any) -> List[str]:
    """The ids of the sessions ``manager`` makes from now on (a list that grows)."""
    made: List[str] = []
    create = manager.create

    async def counted_create(*args: Any, **kwargs: Any) -> Any:
        session = await create(*args, **kwargs)
        made.append(session.id)
        return session

    monkeypatch.setattr(manager, "create", counted_create)
    return made


# --- playing in the browser ------------------------------------------------------------------------


def test_the_page_plays_an_episode(browser: Any, shots: Path) -> None:
    """Load, reset with a seed and a reset keyword, fill and submit the action form: the
    observation (text escaped, images drawn), reward, log, chart, state and snippet are shown."""
    app = guess_app()
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/")  # redirected to /web/
        assert driver.current_url == server.base_url + "/web/"
        by_css(driver, '#reset-fields [name="reset.level"]')[0].send_keys("3")
        reset(driver, seed=5)
        assert "level 3: guess a number <b>0-100</b>" in by_id(driver, "observation").text  # as text, not HTML
        assert by_css(driver, "#observation b b") == []
        fill(driver, "number", 40)
        step(driver)
        assert by_id(driver, "reward").text == "-0.02"
        assert "you said 40" in by_id(driver, "observation").text
        assert by_css(driver, "#observation canvas") and by_css(driver, "#observation img")
        assert len(by_css(driver, "#chart svg rect")) == 1
        assert '"step_count": 1' in by_id(driver, "state").text
        snippet = by_id(driver, "snippet").text
        assert "env.reset(seed=5, level=3)" in snippet and 'env.step({"number": 40, "hint": "none"})' in snippet
        fill(driver, "number", 42)
        step(driver)
        assert by_id(driver, "reward").text == "1" and by_id(driver, "done").text == "done"
        driver.save_screenshot(str(shots / "guess.png"))
        assert console_errors(driver) == []


def test_an_invalid_action_is_shown_as_an_error_and_the_page_goes_on(browser: Any) -> None:
    app = guess_app()
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        reset(driver)
        fill(driver, "number", 500)
        step(driver)
        error = by_id(driver, "error")
        assert error.is_displayed() and "number: Input should be less than or equal to 100" in error.text
        fill(driver, "number", 41)
        step(driver)
        assert not by_id(driver, "error").is_displayed() and "you said 41" in by_id(driver, "observation").text
        assert console_errors(driver, allowed=(422,)) == []


def test_two_visitors_never_see_each_others_episode(browser: Any) -> None:
    app = guess_app()
    with serve(app) as server:
        alice, bob = browser(), browser()
        for driver in (alice, bob):
            load(driver, server.base_url + "/web/")
        reset(alice, seed=1)
        fill(alice, "number", 13)
        step(alice)
        reset(bob, seed=2)
        assert server_of(app).active_sessions == 2
        assert "you said 13" not in by_id(bob, "observation").text
        assert '"step_count": 0' in by_id(bob, "state").text
        assert by_id(alice, "session").text != by_id(bob, "session").text
        fill(bob, "number", 99)
        step(bob)
        assert '"step_count": 1' in by_id(alice, "state").text  # alice's episode did not move
        assert "you said 13" in by_id(alice, "observation").text


def test_visitors_count_against_the_session_limit_and_leaving_frees_the_slot(browser: Any) -> None:
    app = guess_app(max_concurrent_envs=1)
    with serve(app) as server:
        first, second = browser(), browser()
        load(first, server.base_url + "/web/")
        load(second, server.base_url + "/web/")
        reset(first)
        by_id(second, "reset-button").click()
        wait_for(second, lambda d: by_id(d, "error").is_displayed())
        assert "Server at capacity: 1/1" in by_id(second, "error").text
        first.get("about:blank")  # the tab goes away: its session is closed
        deadline = time.monotonic() + 10
        while server_of(app).active_sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server_of(app).active_sessions == 0
        reset(second)
        assert server_of(app).active_sessions == 1
        assert console_errors(second, allowed=(503,)) == []


def test_with_a_token_the_page_asks_for_it_once_and_sends_it_as_a_header(browser: Any) -> None:
    app = Recorder(guess_app(auth_token=TOKEN))
    with serve(app) as server:
        driver = browser()
        driver.get(server.base_url + "/web/")
        wait_for(driver, lambda d: by_id(d, "token-form").is_displayed())
        by_id(driver, "token-input").send_keys("not-the-token-but-long-enough")
        by_id(driver, "token-button").click()
        wait_for(driver, lambda d: "did not accept" in by_id(d, "token-reason").text)
        by_id(driver, "token-input").send_keys(TOKEN)
        by_id(driver, "token-button").click()
        wait_for(driver, lambda d: by_id(d, "reset-button").is_enabled() and not by_id(d, "token-form").is_displayed())
        reset(driver)
        fill(driver, "number", 42)
        step(driver)
        assert by_id(driver, "reward").text == "1"
        load(driver, server.base_url + "/web/")  # a reload: the tab remembers it, nothing is asked
        assert not by_id(driver, "token-form").is_displayed()
        assert all(TOKEN not in seen for seen in app.seen)
        api_calls = [h for s, h in zip(app.seen, app.headers, strict=True) if s.startswith(("/web/step", "/web/reset"))]
        assert api_calls and all(h[b"authorization"] == f"Bearer {TOKEN}".encode() for h in api_calls)
        assert "OPENENV_AUTH_TOKEN" in by_id(driver, "snippet").text and TOKEN not in by_id(driver, "snippet").text
        assert console_errors(driver, allowed=(401,)) == []


def test_render_web_html_cannot_run_code_or_reach_the_server(browser: Any) -> None:
    app = Recorder(guess_app(HostileEnv))
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        reset(driver)
        frame = by_css(driver, "#rendered iframe")[0]
        assert frame.get_attribute("sandbox") == ""
        driver.switch_to.frame(frame)
        assert by_id(driver, "drawn").text == "drawn by render_web"
        by_id(driver, "go").click()  # a form: sandboxed frames cannot submit one
        driver.switch_to.default_content()
        time.sleep(0.5)  # give anything that could run its chance
        assert driver.title == "HostileEnv · OpenEnv playground"  # what the page set, untouched
        assert not any("pwned" in seen for seen in app.seen)
        buttons = by_css(driver, "#web-actions button")
        assert [b.text for b in buttons] == ["guess 42", "guess 7"]
        buttons[0].click()  # web_actions: one click plays the move
        wait_for(driver, lambda d: by_id(d, "done").text == "done")
        assert by_css(driver, "#web-actions button") == []  # none offered once done


@pytest.mark.parametrize("guarded", [True, False], ids=["as-served", "without-frame-ancestors"])
def test_another_site_cannot_frame_the_page(browser: Any, monkeypatch: Any, guarded: bool) -> None:
    """A page of another origin puts the playground in an iframe (to lure clicks on Step or the
    token form). Served as it is, the browser refuses to show it: the framed page never runs, so
    its script never loads nor asks for the metadata. Without frame-ancestors / X-Frame-Options
    the same page runs in the frame."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    from openenv.core.env_server import web

    if not guarded:
        policy = web._PAGE_HEADERS["content-security-policy"].replace("; frame-ancestors 'none'", "")
        unguarded = {k: v for k, v in web._PAGE_HEADERS.items() if k != "x-frame-options"}
        monkeypatch.setattr(web, "_PAGE_HEADERS", {**unguarded, "content-security-policy": policy})
    app = Recorder(guess_app())
    with serve(app) as server:

        async def lure(request: Any) -> HTMLResponse:
            return HTMLResponse(
                f'<html><body><iframe src="{server.base_url}/web/" width=900 height=700></iframe></body></html>'
            )

        with serve(Starlette(routes=[Route("/", lure)])) as other:
            driver = browser()
            driver.get(other.base_url + "/")
            wait_for(driver, lambda d: any(seen.startswith("/web/?") for seen in app.seen))
            if guarded:
                time.sleep(2.0)  # the framed page's script would have asked for the metadata by now
                assert not any(seen.startswith(("/web/metadata", "/web/playground.js")) for seen in app.seen), app.seen
            else:
                wait_for(driver, lambda d: any(seen.startswith("/web/metadata") for seen in app.seen))


@pytest.mark.parametrize("guarded", [True, False], ids=["as-served", "with-any-origin-allowed"])
def test_another_sites_page_cannot_drive_a_server_without_a_token(
    browser: Any, monkeypatch: Any, guarded: bool
) -> None:
    """A page of another site that a developer happens to open tries to use the server on their
    machine (no token: the default): a WebSocket to /ws that resets and steps (browsers apply no
    CORS to WebSockets) and a text/plain POST /mcp that creates a session (a "simple" request, sent
    without asking). As served, the browser's Origin header gets both refused: no session is ever
    made. With every origin allowed (OPENENV_ALLOWED_ORIGINS=*, the guard off) the same page
    steps the environment and takes the server's slots."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    if not guarded:
        monkeypatch.setenv("OPENENV_ALLOWED_ORIGINS", "*")
    app = guess_app(web=False)
    manager = server_of(app).manager
    made = sessions_made(manager, monkeypatch)
    with serve(app) as server:
        target = server.base_url
        script = f"""
            const report = (key, value) => {{ document.body.dataset[key] = value; }};
            const ws = new WebSocket("{target.replace("http", "ws")}/ws");
            ws.onopen = () => ws.send(JSON.stringify({{type: "reset", data: {{}}}}));
            ws.onmessage = (e) => {{
              const reply = JSON.parse(e.data);
              if (reply.type === "observation" && !document.body.dataset.stepped) {{
                report("stepped", "1");
                ws.send(JSON.stringify({{type: "step", data: {{number: 7}}}}));
              }} else {{ report("ws", "answered"); }}
            }};
            ws.onerror = () => report("ws", "refused");
            fetch("{target}/mcp", {{method: "POST", mode: "no-cors", headers: {{"content-type": "text/plain"}},
              body: JSON.stringify({{jsonrpc: "2.0", id: 1, method: "openenv/session/create", params: {{}}}})}})
              .then(() => report("posted", "1"), () => report("posted", "failed"));
        """

        async def lure(request: Any) -> HTMLResponse:
            return HTMLResponse(f"<html><body><script>{script}</script></body></html>")

        with serve(Starlette(routes=[Route("/", lure)])) as other:
            driver = browser()
            driver.get(other.base_url + "/")
            data = "return [document.body.dataset.ws, document.body.dataset.posted]"
            wait_for(driver, lambda d: all(d.execute_script(data)))
            ws, posted = driver.execute_script(data)
            assert posted == "1"  # sent (a no-cors answer is opaque to the page either way)
            if guarded:
                assert ws == "refused" and made == [] and manager.active_sessions == 0
            else:
                assert ws == "answered" and driver.execute_script("return document.body.dataset.stepped") == "1"
                assert len(made) == 2  # the socket's session and the one POST /mcp created


class RebindingSite:
    """A site whose name has just been turned to this machine (DNS rebinding), on 127.0.0.1: its
    page (``GET /lure.html``, served before the name was turned, as it were) comes from the
    attacker; every other connection reaches ``target``'s port byte for byte, Host and Origin as the
    browser wrote them, as a rebound name sends them to the victim's server."""

    def __init__(self, target_port: int, page: str) -> None:
        self.target_port, self.page = target_port, page.encode()
        self.port = 0
        self._ready = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET /lure.html "):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\nconnection: close\r\n")
                writer.write(b"content-length: %d\r\n\r\n%s" % (len(self.page), self.page))
                await writer.drain()
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            up_writer.write(head)

            async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
                with contextlib.suppress(Exception):
                    while chunk := await source.read(65536):
                        sink.write(chunk)
                        await sink.drain()
                with contextlib.suppress(Exception):
                    sink.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the browser left, or the site is closing
        finally:
            writer.close()

    def __enter__(self) -> RebindingSite:
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


@pytest.mark.parametrize("guarded", [True, False], ids=["as-served", "with-any-host-allowed"])
def test_a_page_whose_name_rebinds_to_this_machine_cannot_drive_the_server(
    browser: Any, monkeypatch: Any, guarded: bool
) -> None:
    """DNS rebinding: a page of rebind.example whose name its owner then turns to 127.0.0.1.
    To the browser the page and the server are now one origin: the page's Origin equals the Host
    it sends, so the origin check alone lets it open a playground session, reset and step it, and
    reset and step over /ws. As served, the name is not one the server is known by: every such
    call is refused and no session is made. With every name allowed (OPENENV_ALLOWED_HOSTS=*) the
    same page plays the environment."""
    if not guarded:
        monkeypatch.setenv("OPENENV_ALLOWED_HOSTS", "*")
    app = guess_app()
    manager = server_of(app).manager
    made = sessions_made(manager, monkeypatch)
    script = """
        const report = (key, value) => { document.body.dataset[key] = value; };
        const json = {"content-type": "application/json"};
        fetch("/web/session", {method: "POST", headers: json, body: "{}"})
          .then((r) => r.json())
          .then(async (opened) => {
            if (!opened.session_id) { report("web", "refused " + opened.code); return; }
            const headers = {...json, "x-openenv-session": opened.session_id};
            await fetch("/web/reset", {method: "POST", headers, body: "{}"});
            const stepped = await (await fetch("/web/step", {method: "POST", headers,
              body: JSON.stringify({action: {number: 42}})})).json();
            report("web", "stepped " + stepped.reward);
          }, () => report("web", "failed"));
        const ws = new WebSocket("ws://" + location.host + "/ws");
        ws.onopen = () => ws.send(JSON.stringify({type: "reset", data: {}}));
        ws.onmessage = (e) => {
          const reply = JSON.parse(e.data);
          if (reply.type === "observation" && !document.body.dataset.stepped) {
            report("stepped", "1");
            ws.send(JSON.stringify({type: "step", data: {number: 7}}));
          } else { report("ws", "answered"); }
        };
        ws.onerror = () => report("ws", "refused");
    """
    with (
        serve(app) as server,
        RebindingSite(server.port, f"<html><body><script>{script}</script></body></html>") as site,
    ):
        driver = browser("--host-resolver-rules=MAP rebind.example 127.0.0.1")
        driver.get(f"http://rebind.example:{site.port}/lure.html")
        data = "return [document.body.dataset.web, document.body.dataset.ws]"
        wait_for(driver, lambda d: all(d.execute_script(data)))
        web, ws = driver.execute_script(data)
        if guarded:
            assert web == "refused FORBIDDEN_HOST" and ws == "refused"
            assert made == [] and manager.active_sessions == 0
        else:
            assert web == "stepped 1" and ws == "answered"
            assert len(made) == 2  # the playground's session and the socket's


# --- the catalogue's environments in the browser ---------------------------------------------------


def test_echo_through_the_tool_picker(browser: Any, shots: Path) -> None:
    from echo_env.server.echo_environment import EchoEnvironment

    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    app = create_app(EchoEnvironment, CallToolAction, CallToolObservation, env_name="echo_env", web=True)
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        reset(driver)
        options = [o.text for o in by_css(driver, "#tool-select option")]
        assert options == ["echo_message", "echo_with_length"]
        fill(driver, "message", "hello from the browser")
        step(driver)
        assert "hello from the browser" in by_id(driver, "observation").text
        assert by_id(driver, "reward").text == str(round(0.1 * len("hello from the browser"), 10))
        assert '"tool_name": "echo_message"' in by_id(driver, "snippet").text
        driver.save_screenshot(str(shots / "echo.png"))
        assert console_errors(driver) == []


def test_chess_by_clicking_legal_moves(browser: Any, shots: Path) -> None:
    from chess_env.models import ChessAction, ChessObservation, ChessState
    from chess_env.server.chess_environment import ChessEnvironment

    app = create_app(
        ChessEnvironment, ChessAction, ChessObservation, env_name="chess_env", state_cls=ChessState, web=True
    )
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        reset(driver, seed=3)
        moves = {b.text: b for b in by_css(driver, "#web-actions button")}
        assert len(moves) == 20 and "e4" in moves
        moves["e4"].click()
        wait_for(driver, lambda d: len(by_css(d, "#log tbody tr")) == 2)
        assert '"move_history": [\n  "e2e4"' in by_id(driver, "state").text
        driver.switch_to.frame(by_css(driver, "#rendered iframe")[0])
        assert by_css(driver, "svg")  # the board
        driver.switch_to.default_content()
        driver.save_screenshot(str(shots / "chess.png"))
        assert console_errors(driver) == []


def test_the_python_box_shows_the_move_a_button_sent(browser: Any) -> None:
    """Papercut 11: after a move made by clicking (web_actions), "the same call in Python" is that
    move, not the empty action form's ``{"move": ""}``; editing the form shows what Step would send."""
    from chess_env.models import ChessAction, ChessObservation, ChessState
    from chess_env.server.chess_environment import ChessEnvironment

    app = create_app(
        ChessEnvironment, ChessAction, ChessObservation, env_name="chess_env", state_cls=ChessState, web=True
    )
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        reset(driver, seed=3)
        assert "env.step(" not in by_id(driver, "snippet").text  # nothing sent yet
        {b.text: b for b in by_css(driver, "#web-actions button")}["e4"].click()
        wait_for(driver, lambda d: len(by_css(d, "#log tbody tr")) == 2)
        snippet = by_id(driver, "snippet").text
        assert 'env.step({"move": "e2e4"})' in snippet and '"move": ""' not in snippet
        fill(driver, "move", "d7d5")  # the form edited: the snippet previews it
        wait_for(driver, lambda d: 'env.step({"move": "d7d5"})' in by_id(d, "snippet").text)
        reset(driver, seed=4)
        assert "env.step(" not in by_id(driver, "snippet").text


def test_connect4_by_clicking_columns(browser: Any) -> None:
    from connect4_env.models import Connect4Action, Connect4Observation, Connect4State
    from connect4_env.server.connect4_environment import Connect4Environment

    app = create_app(
        Connect4Environment,
        Connect4Action,
        Connect4Observation,
        env_name="connect4_env",
        state_cls=Connect4State,
        web=True,
    )
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        reset(driver, seed=1)
        columns = by_css(driver, "#web-actions button")
        assert [c.text for c in columns] == [f"column {i}" for i in range(7)]
        columns[3].click()
        wait_for(driver, lambda d: len(by_css(d, "#log tbody tr")) == 2)
        assert '"moves": [\n  3' in by_id(driver, "state").text


def test_blackjack_shows_the_cards(browser: Any, shots: Path) -> None:
    from openspiel_env.models import OpenSpielAction, OpenSpielObservation, OpenSpielState
    from openspiel_env.server.openspiel_environment import OpenSpielEnvironment

    app = create_app(
        OpenSpielEnvironment,
        OpenSpielAction,
        OpenSpielObservation,
        env_name="openspiel_env",
        state_cls=OpenSpielState,
        web=True,
    )
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        by_css(driver, '#reset-fields [name="reset.game_name"]')[0].send_keys("blackjack")
        reset(driver, seed=4)
        assert [b.text for b in by_css(driver, "#web-actions button")] == ["HIT", "STAND"]
        driver.switch_to.frame(by_css(driver, "#rendered iframe")[0])
        assert len(by_css(driver, "#cards-you .card")) == 2
        driver.switch_to.default_content()
        driver.save_screenshot(str(shots / "blackjack.png"))
        by_css(driver, "#web-actions button")[1].click()  # STAND: the hand ends
        wait_for(driver, lambda d: by_id(d, "done").text == "done")
        assert console_errors(driver) == []


def test_wordle_by_typing(browser: Any) -> None:
    from textarena_env.models import TextArenaAction, TextArenaObservation, TextArenaState
    from textarena_env.server.textarena_environment import TextArenaEnvironment

    app = create_app(
        TextArenaEnvironment,
        TextArenaAction,
        TextArenaObservation,
        env_name="textarena_env",
        state_cls=TextArenaState,
        web=True,
    )
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        reset(driver, seed=2)
        fill(driver, "message", "[crane]")
        step(driver)
        assert "crane" in by_id(driver, "observation").text.lower()
        assert '"turn": 1' in by_id(driver, "state").text


def test_a_shell_task_through_its_tools(browser: Any, shots: Path) -> None:
    from shell_env.models import ShellObservation, ShellState
    from shell_env.server.shell_environment import ShellEnvironment

    from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

    app = create_app(
        ShellEnvironment,
        CallToolAction,
        CallToolObservation,
        env_name="shell_env",
        reset_observation_cls=ShellObservation,
        state_cls=ShellState,
        web=True,
    )
    with serve(app) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        reset(driver, seed=0)
        assert "instruction" in by_id(driver, "observation").text
        from selenium.webdriver.support.ui import Select

        Select(by_id(driver, "tool-select")).select_by_visible_text("run_command")
        fill(driver, "command", "echo made in the browser > note.txt && ls")
        step(driver)
        assert "note.txt" in by_id(driver, "observation").text
        driver.save_screenshot(str(shots / "shell.png"))
        assert console_errors(driver) == []


# --- the routes over HTTP --------------------------------------------------------------------------


def test_the_page_is_off_unless_asked_for() -> None:
    app = guess_app(web=False)
    with serve(app) as server:
        assert httpx.get(server.base_url + "/").status_code == 404
        assert httpx.get(server.base_url + "/web/").status_code == 404


def test_enable_web_interface_turns_it_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENABLE_WEB_INTERFACE", "true")
    with serve(guess_app(web=False)) as server:
        assert httpx.get(server.base_url + "/web").headers["location"] == "web/"
    monkeypatch.setenv("ENABLE_WEB_INTERFACE", "0")
    with serve(guess_app(web=True)) as server:
        assert httpx.get(server.base_url + "/web/").status_code == 404
    monkeypatch.setenv("ENABLE_WEB_INTERFACE", "maybe")
    with pytest.raises(ValueError, match="ENABLE_WEB_INTERFACE must be 1 or 0"):
        guess_app()


def test_upstream_names_build_the_app_with_the_page() -> None:
    from openenv.core.env_server import WebInterfaceManager, create_web_interface_app, web_interface

    app = create_web_interface_app(GuessEnv, GuessAction, GuessObservation, env_name="guess")
    with serve(app) as server:
        assert httpx.get(server.base_url + "/web/").status_code == 200
    # the package map's names are web_interface's (upstream's WebInterfaceManager, not the page's routes)
    assert WebInterfaceManager is web_interface.WebInterfaceManager
    assert create_web_interface_app is web_interface.create_web_interface_app


def test_the_page_weighs_under_200_kb_and_is_package_data() -> None:
    from importlib import resources

    files = resources.files("openenv.core.env_server.web").joinpath("static")
    sizes = {f.name: len(f.read_bytes()) for f in files.iterdir()}
    assert set(sizes) == {"index.html", "playground.css", "playground.js"}
    assert sum(sizes.values()) < 200 * 1024
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"openenv.core.env_server.web" = ["static/*"]' in pyproject


def test_with_a_token_only_the_page_files_are_open() -> None:
    with serve(guess_app(auth_token=TOKEN)) as server:
        for path in ("/", "/web", "/web/", "/web/playground.js", "/web/playground.css"):
            assert httpx.get(server.base_url + path).status_code in (200, 307), path
        for method, path in [("GET", "/web/metadata"), ("POST", "/web/session"), ("POST", "/web/reset")]:
            assert httpx.request(method, server.base_url + path, json={}).status_code == 401, path
        assert httpx.post(server.base_url + "/web/", content=b"{}").status_code == 401  # GET only
        headers = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(server.base_url + "/web/metadata", headers=headers).status_code == 200


def test_web_sessions_are_the_servers_sessions() -> None:
    app = guess_app(max_concurrent_envs=2)
    with serve(app) as server, httpx.Client(base_url=server.base_url) as http:
        plain = http.post("/web/session", content=b"{}", headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415  # what another site's page may send without asking
        ids = [http.post("/web/session", json={}).json()["session_id"] for _ in range(2)]
        full = http.post("/web/session", json={})
        assert full.status_code == 503 and full.json()["code"] == "CAPACITY_REACHED"
        assert server_of(app).get_capacity_status().active_sessions == 2
        first = {"X-OpenEnv-Session": ids[0]}
        assert http.post("/web/reset", json={"seed": -1}, headers=first).status_code == 422
        assert http.post("/web/reset", json={"seed": 1}, headers=first).json()["state"]["step_count"] == 0
        bad = http.post("/web/step", json={"number": 3}, headers=first)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["action"]
        assert http.post("/web/step", content=b"{nope", headers=first).json()["code"] == "INVALID_JSON"
        view = http.post("/web/step", json={"action": {"number": 42}}, headers=first).json()
        assert view["reward"] == 1.0 and view["done"] is True and view["html"] is None
        assert http.get("/web/state", headers=first).json()["step_count"] == 1
        assert http.get("/web/state").json()["code"] == "SESSION_ERROR"  # no session named
        assert http.delete("/web/session", headers=first).json()["closed"] is True
        gone = http.get("/web/state", headers=first)
        assert gone.status_code == 404 and ids[0] in gone.json()["detail"]
        assert http.post("/web/session", json={}).status_code == 200  # its slot is free again


def test_idle_web_sessions_are_reaped() -> None:
    from openenv.core.env_server.types import ConcurrencyConfig

    app = guess_app(
        max_concurrent_envs=None, concurrency_config=ConcurrencyConfig(max_concurrent_envs=2, session_timeout=0.3)
    )
    with serve(app) as server, httpx.Client(base_url=server.base_url) as http:
        session = {"X-OpenEnv-Session": http.post("/web/session", json={}).json()["session_id"]}
        deadline = time.monotonic() + 5
        while server_of(app).active_sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        answer = http.get("/web/state", headers=session)
        assert answer.status_code == 404 and "without a call" in answer.json()["detail"]


def test_hooks_that_fail_are_reported_and_the_step_still_answers() -> None:
    class Broken(GuessEnv):
        def render_web(self, observation: dict) -> Optional[str]:
            raise RuntimeError("secret path /srv/x")

        def web_actions(self, observation: dict) -> List[tuple]:
            return ["not a pair"]  # type: ignore[list-item]

    with serve(guess_app(Broken, error_details=False)) as server, httpx.Client(base_url=server.base_url) as http:
        session = {"X-OpenEnv-Session": http.post("/web/session", json={}).json()["session_id"]}
        view = http.post("/web/reset", json={}, headers=session).json()
        assert "RuntimeError" in view["html"]["error"] and "/srv/x" not in view["html"]["error"]
        assert view["actions"] == {"error": "web_actions: must return (label, action dict) pairs"}
        assert view["observation"]["text"].startswith("level 1")


def test_reset_keywords_become_typed_fields_of_the_reset_form() -> None:
    from openenv.core.env_server.web import reset_arguments

    class Configurable(GuessEnv):
        def reset(  # type: ignore[override]
            self,
            seed: Optional[int] = None,
            episode_id: Optional[str] = None,
            level: int = 1,
            name: Optional[str] = None,
            ratio: float | None = 0.5,
            options: Optional[Dict[str, Any]] = None,
            **more: Any,
        ) -> GuessObservation:
            return GuessObservation()

    assert reset_arguments(Configurable) == {
        "fields": [
            {"name": "level", "type": "integer", "default": 1},
            {"name": "name", "type": "string", "default": None},
            {"name": "ratio", "type": "number", "default": 0.5},
            {"name": "options", "type": "json", "default": None},
        ],
        "any": True,
    }
    assert reset_arguments(GuessEnv)["any"] is False


CATALOGUE = sorted(
    p.name for p in (Path(__file__).parents[1] / "envs").glob("*_env") if (p / "server" / "app.py").exists()
)


def catalogue_app(name: str) -> Any:
    """The app of ``envs/<name>``, made again with the page (its module made it without)."""
    import importlib

    module = importlib.import_module(f"{name}.server.app")
    served = module.app.state.openenv_server
    return create_app(
        served.manager._factory,
        served.action_cls,
        served.observation_cls,
        env_name=served.env_name,
        concurrency_config=served.concurrency_config,
        state_cls=served.state_cls,
        reset_observation_cls=served.reset_observation_cls,
        web=True,
    )


@pytest.mark.parametrize("name", CATALOGUE)
def test_every_catalogue_environment_loads_and_resets_in_the_page(browser: Any, name: str) -> None:
    pytest.importorskip(name)
    with serve(catalogue_app(name)) as server:
        driver = browser()
        load(driver, server.base_url + "/web/")
        reset(driver, seed=1)
        assert by_id(driver, "done").text == "running"
        assert by_css(driver, "#action-fields input, #action-fields textarea, #action-fields select")
        assert console_errors(driver) == []
