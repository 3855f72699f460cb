"""The echo environment's quick-start, async then sync.

Needs an echo server: ``python -m uvicorn echo_env.server.app:app --port 8000`` (or run
``python examples/echo_demo.py``, which starts one). ``OPENENV_URL`` overrides the URL.
"""

import asyncio
import os

from echo_env import CallToolAction, EchoEnv

URL = os.environ.get("OPENENV_URL", "http://127.0.0.1:8000")


async def main() -> None:
    async with EchoEnv(base_url=URL) as client:
        result = await client.reset()
        print(result.observation.echoed_message)  # "Echo environment ready!"
        result = await client.step(CallToolAction(tool_name="echo_message", arguments={"message": "Hello, World!"}))
        print(result.observation.result)  # "Hello, World!"
        print(result.reward)  # a number
        print([tool.name for tool in await client.list_tools()])  # ['echo_message', 'echo_with_length']
        print(await client.call_tool("echo_with_length", message="Test"))  # {'message': 'Test', 'length': 4}


asyncio.run(main())

with EchoEnv(base_url=URL).sync() as client:  # same, synchronously
    result = client.reset()
    print(result.observation.echoed_message)  # "Echo environment ready!"
    result = client.step(CallToolAction(tool_name="echo_message", arguments={"message": "Hello, World!"}))
    print(result.observation.result)  # "Hello, World!"
    print(result.reward)  # a number
