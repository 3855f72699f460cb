"""Declarative GET endpoints (kept for environments that register extra routes this way)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Type

from fastapi import FastAPI


@dataclass
class GetEndpointConfig:
    path: str
    handler: Callable[[], Any]
    response_model: Optional[Type[Any]] = None
    tag: Optional[str] = None
    summary: Optional[str] = None
    description: Optional[str] = None


def register_get_endpoints(app: FastAPI, configs: Iterable[GetEndpointConfig]) -> None:
    """Add each config as a GET route; sync handlers run in the threadpool, not on the loop."""
    for config in configs:
        handler = config.handler
        endpoint = handler if inspect.iscoroutinefunction(handler) else _sync_endpoint(handler)
        app.get(
            config.path,
            response_model=config.response_model,
            tags=[config.tag] if config.tag else None,
            summary=config.summary,
            description=config.description,
        )(endpoint)


def _sync_endpoint(handler: Callable[[], Any]) -> Callable[[], Any]:
    def endpoint() -> Any:  # FastAPI runs plain functions in its threadpool
        return handler()

    return endpoint
