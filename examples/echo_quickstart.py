"""The echo environment's quick-start (README.md), async then sync.

Needs an echo server: ``.venv/bin/python -m openenv.core.env_server echo_env.server.app:app --port 8000``, or
run ``make demo``, which starts one and runs this. ``OPENENV_URL`` overrides the URL.
"""

import asyncio
import os

from echo_env import CallToolAction, EchoEnv

URL = os.environ.get("OPENENV_URL", "http://127.0.0.1:8000")


async def main() -> None:
    async with EchoEnv(base_url=URL) as client:
        result = await client.reset()
        print(result.observation.echoed_message)  # Echo environment ready!
        action = CallToolAction(tool_name="echo_message", arguments={"message": "Hello, World!"})
        result = await client.step(action)
        print(result.observation.result)  # Hello, World!
        print(result.reward)  # 1.3 (0.1 per character echoed)
        print([tool.name for tool in await client.list_tools()])  # ['echo_message', 'echo_with_length']


asyncio.run(main())

with EchoEnv(base_url=URL).sync() as client:  # the same, synchronously
    print(client.reset().observation.echoed_message)  # Echo environment ready!
    print(client.call_tool("echo_with_length", message="Test"))  # {'message': 'Test', 'length': 4}
