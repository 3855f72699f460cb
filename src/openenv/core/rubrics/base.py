"""``Rubric``: a reward function made of named, inspectable parts (RFC 004).

A rubric maps ``(action, observation)`` to a score. Like a ``torch.nn.Module`` it holds other
rubrics as attributes, and those become its named children: ``rubric.named_rubrics()`` walks the
tree with dotted names, ``rubric.component_scores()`` reports what each part scored in the last
call (a reward vector beside the scalar reward), and hooks see every call.

``forward`` may be a plain function or a coroutine function. Calling a rubric whose ``forward``
and hooks are sync returns the score. Calling one whose ``forward`` is async, or that has an
async hook, or whose sync ``forward`` hands back an awaitable (a container with an async child
does) returns a coroutine to await.
"""

from __future__ import annotations

import inspect
from abc import ABCMeta, abstractmethod
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

Hook = Callable[..., Any]


class Score(float):
    """A score that can also be awaited (it awaits to itself as a plain float).

    Upstream's ``Sequential`` returns a coroutine whenever it is called inside a running event
    loop, all-sync children or none, so code written for it writes ``await rubric(...)`` in async
    code; ours returns the number, as this ``float``, which serves both ``await rubric(...)`` and
    ``rubric(...) + 1``."""

    __slots__ = ()

    def __await__(self) -> Any:
        return float(self)
        yield  # a generator function: awaiting it returns at once  # pragma: no cover


def pending(value: Any) -> bool:
    """Whether a rubric's result must be awaited for its score (a coroutine; not a :class:`Score`)."""
    return inspect.isawaitable(value) and not isinstance(value, float)


class HookHandle:
    """Returned by the ``register_*hook`` methods: ``handle.remove()`` unregisters the hook."""

    def __init__(self, hooks: List[Hook], hook: Hook) -> None:
        self._hooks = hooks
        self._hook = hook

    def remove(self) -> None:
        """Unregister the hook (a second call does nothing)."""
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


class Rubric(metaclass=ABCMeta):
    """Base class of reward functions: implement ``forward(action, observation) -> float`` (a
    subclass without it cannot be instantiated: ``TypeError``, as upstream's abstract base).

    ``last_score`` is what this rubric returned on its latest call, and ``None`` before the first
    one. A call also clears the ``last_score`` of every descendant first, so after a call a
    descendant that was not evaluated (a ``Sequential`` stopped before it) reads ``None`` rather
    than a score from an earlier step.
    """

    last_score: Optional[float]

    def __init__(self) -> None:
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_pre_hooks", [])
        object.__setattr__(self, "_post_hooks", [])
        object.__setattr__(self, "last_score", None)

    # --- children ---------------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        children = self.__dict__.get("_children")
        if children is None:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() before setting attributes")
        if isinstance(value, Rubric):
            children[name] = value
        elif name in children:
            del children[name]
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._children.pop(name, None)
        object.__delattr__(self, name)

    def children(self) -> Iterator[Rubric]:
        """Direct children, in the order they were set."""
        return iter(list(self._children.values()))

    def named_children(self) -> Iterator[Tuple[str, Rubric]]:
        """``(attribute name, child)`` for each direct child, in the order they were set."""
        return iter(list(self._children.items()))

    def rubrics(self) -> Iterator[Rubric]:
        """Every descendant, depth first (not this rubric itself)."""
        for _, rubric in self.named_rubrics():
            yield rubric

    def named_rubrics(self, prefix: str = "") -> Iterator[Tuple[str, Rubric]]:
        """``(dotted name, rubric)`` for every descendant, depth first."""
        for name, child in list(self._children.items()):
            path = f"{prefix}.{name}" if prefix else name
            yield path, child
            yield from child.named_rubrics(path)

    def get_rubric(self, path: str) -> Rubric:
        """The descendant at ``"a.b.c"``; ``KeyError`` naming the missing part otherwise."""
        node: Rubric = self
        for part in path.split("."):
            child = node._children.get(part)
            if child is None:
                known = ", ".join(node._children) or "none"
                raise KeyError(f"no rubric {part!r} in {path!r} (children here: {known})")
            node = child
        return node

    def component_scores(self) -> Dict[str, float]:
        """What each descendant scored in the last call, by dotted name (a reward vector).

        Descendants not evaluated in that call (skipped by a ``Sequential``, or containers such as
        ``RubricDict`` that are never called themselves) are left out.
        """
        return {name: rubric.last_score for name, rubric in self.named_rubrics() if rubric.last_score is not None}

    # --- hooks ------------------------------------------------------------------------------

    def register_forward_pre_hook(self, hook: Hook) -> HookHandle:
        """Call ``hook(rubric, action, observation)`` before every evaluation.

        An ``async def`` hook makes every call of this rubric return a coroutine.
        """
        self._pre_hooks.append(hook)
        return HookHandle(self._pre_hooks, hook)

    def register_forward_hook(self, hook: Hook) -> HookHandle:
        """Call ``hook(rubric, action, observation, score)`` after every evaluation.

        An ``async def`` hook makes every call of this rubric return a coroutine.
        """
        self._post_hooks.append(hook)
        return HookHandle(self._post_hooks, hook)

    # --- calling ----------------------------------------------------------------------------

    @abstractmethod
    def forward(self, action: Any, observation: Any) -> Any:
        """The score of ``action`` given ``observation`` (``async def`` is allowed)."""

    def __call__(self, action: Any, observation: Any) -> Any:
        if inspect.iscoroutinefunction(self.forward) or any(
            inspect.iscoroutinefunction(hook) for hook in (*self._pre_hooks, *self._post_hooks)
        ):
            return self._call_async(action, observation, None)
        self._clear_descendant_scores()
        for hook in self._pre_hooks:
            _no_awaitable(hook(self, action, observation), hook)
        score = self.forward(action, observation)
        if pending(score):  # e.g. a container with an async child
            return self._call_async(action, observation, score)
        self.last_score = score
        for hook in self._post_hooks:
            _no_awaitable(hook(self, action, observation, score), hook)
        return score

    async def _call_async(self, action: Any, observation: Any, started: Any) -> Any:
        if started is None:
            self._clear_descendant_scores()
            for hook in self._pre_hooks:
                result = hook(self, action, observation)
                if inspect.isawaitable(result):
                    await result
            started = self.forward(action, observation)
        score = await started if inspect.isawaitable(started) else started  # a Score awaits to its float
        self.last_score = score
        for hook in self._post_hooks:
            result = hook(self, action, observation, score)
            if inspect.isawaitable(result):
                await result
        return score

    def _clear_descendant_scores(self) -> None:
        for rubric in self.rubrics():
            object.__setattr__(rubric, "last_score", None)

    # --- episodes and configuration ---------------------------------------------------------

    def reset(self) -> None:
        """Start a new episode: clears per-episode memory here and in every descendant.

        Subclasses that keep per-episode memory override it and call ``super().reset()``.
        """
        for child in self._children.values():
            child.reset()

    async def reset_async(self) -> None:
        """``reset`` for async callers (``Environment._reset_rubric_async``)."""
        self.reset()

    def state_dict(self) -> Dict[str, Any]:
        """Configuration (not per-episode data), with each child's under its attribute name.

        Children without configuration are left out. Subclasses add their own keys and call
        ``super().state_dict()``.
        """
        state: Dict[str, Any] = {}
        for name, child in self._children.items():
            child_state = child.state_dict()
            if child_state:
                state[name] = child_state
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore configuration saved by :meth:`state_dict` (missing keys keep their value)."""
        for name, child in self._children.items():
            child_state = state.get(name)
            if isinstance(child_state, dict):
                child.load_state_dict(child_state)

    def __repr__(self) -> str:
        if not self._children:
            return f"{type(self).__name__}()"
        inner = "\n".join(f"  ({name}): " + repr(child).replace("\n", "\n  ") for name, child in self._children.items())
        return f"{type(self).__name__}(\n{inner}\n)"


def _no_awaitable(result: Any, hook: Hook) -> None:
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise TypeError(
            f"hook {getattr(hook, '__name__', hook)!r} returned an awaitable from a sync rubric call: "
            "declare it with 'async def' so the rubric awaits it"
        )
