"""finqa_env: answer a financial question by querying a small SQLite database through MCP tools.

Each episode poses one of the shipped questions (``data/questions.json``) about six invented
companies (``data/finqa.sql``). Tools (upstream FinQA's names):

* ``get_descriptions(company_name)`` — the tables, with a line each (JSON);
* ``get_table_info(company_name, table_name)`` — a table's columns and what the company has in it;
* ``sql_query(query, company_name="", table_name="")`` — one read-only SELECT over the whole
  database; at most ``MAX_ROWS`` rows, stopped after ``QUERY_TIMEOUT_S`` seconds;
* ``submit_answer(answer)`` — scores the answer and ends the episode.

Reward: on ``submit_answer``, 1.0 when the answer matches (numbers within 1%, see ``rewards.py``),
else 0.0. The episode also ends, with reward 0.0, after ``max_steps`` tool calls (``FINQA_MAX_STEPS``,
default 50). Every other call has reward 0.0.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Dict, List, Optional
from uuid import uuid4

from fastmcp import FastMCP

from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation

try:
    from ..models import AVAILABLE_TOOLS, FinQAState
    from .database import TABLE_DESCRIPTIONS, companies, load_questions, open_database, run_query, table_info
    from .rewards import compute_reward
except ImportError:  # served from the package directory as `server.app:app`
    from models import AVAILABLE_TOOLS, FinQAState  # type: ignore[no-redef]
    from server.database import (  # type: ignore[no-redef]
        TABLE_DESCRIPTIONS,
        companies,
        load_questions,
        open_database,
        run_query,
        table_info,
    )
    from server.rewards import compute_reward  # type: ignore[no-redef]


class FinQAEnvironment(MCPEnvironment):
    """Financial QA over SQL tool calls; see the module docstring.

    Snapshots save the session's own attributes (the default): the question and the episode's
    state (tool calls, answer, reward), the shuffled question order, its position and the
    generator that reshuffles it, and ``max_steps``. Left out: the SQLite connection to the
    read-only database and the loaded questions, both rebuilt as they were by the constructor;
    the tools keep their state on the environment, and MCPEnvironment leaves out their server.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    SUPPORTS_SNAPSHOT = True
    SNAPSHOT_EXCLUDE = ("_db", "questions")

    def __init__(self, max_steps: Optional[int] = None) -> None:
        mcp = FastMCP("finqa_env")
        self.max_steps = max_steps or int(os.environ.get("FINQA_MAX_STEPS", "50"))
        self.questions = load_questions()
        self._db = open_database()
        self._rng = random.Random()
        self._order: List[Dict[str, Any]] = []
        self._position = 0
        self._question: Optional[Dict[str, Any]] = None
        self._ended_by_last_call = False

        @mcp.tool(run_in_thread=False)
        def get_descriptions(company_name: str = "") -> str:
            """List the database's tables with a one-line description each (JSON). Every table covers
            all companies; ``company_name`` (a name or ticker) is checked when given."""
            self._begin_call()
            if company_name:
                self._company(company_name)
            return json.dumps([{"table": t, "description": d} for t, d in TABLE_DESCRIPTIONS.items()])

        @mcp.tool(run_in_thread=False)
        def get_table_info(table_name: str, company_name: str = "") -> str:
            """Describe a table (JSON): its columns and types, and with ``company_name`` how many rows
            and which fiscal years (and segments) that company has in it."""
            self._begin_call()
            table = self._table(table_name)
            company = self._company(company_name) if company_name else None
            return json.dumps(table_info(self._db, table, company["company_id"] if company else None))

        @mcp.tool
        def sql_query(query: str, company_name: str = "", table_name: str = "") -> str:
            """Run one read-only SQL SELECT over the whole database (tables: companies,
            income_statement, balance_sheet, segment_revenue; join on company_id). Returns JSON
            {columns, rows, truncated}: at most 200 rows, stopped after 2 seconds. ``company_name``
            and ``table_name`` are optional and only checked."""
            self._begin_call()
            if company_name:
                self._company(company_name)
            if table_name:
                self._table(table_name)
            return json.dumps(run_query(self._db, query))

        @mcp.tool(run_in_thread=False)
        def submit_answer(answer: str) -> str:
            """Submit the final answer (numbers in the question's unit, e.g. millions of USD or
            percent; \\boxed{...} is accepted). Ends the episode and returns the result (JSON)."""
            self._begin_call()
            return json.dumps(self._submit(str(answer)))

        super().__init__(mcp)
        self._state = FinQAState(max_steps=self.max_steps)
        self._shuffle()

    # --- episode --------------------------------------------------------------------------------

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        question_id: Optional[str] = None,
        **kwargs: Any,
    ) -> Observation:
        """The next question of a shuffled pass over all questions; ``seed`` reshuffles (the same
        seed gives the same sequence), ``question_id`` (``"q01"``...) picks one. Other keyword
        arguments are ignored."""
        self._question = None
        self._state = FinQAState(episode_id=episode_id or str(uuid4()), max_steps=self.max_steps, done=True)
        if seed is not None:
            self._rng = random.Random(seed)
            self._shuffle()
        if question_id is not None:
            found = [q for q in self.questions if q["id"] == question_id]
            if not found:
                ids = ", ".join(q["id"] for q in self.questions)
                return Observation(
                    done=True, metadata={"error": f"unknown question_id {question_id!r}: choose one of {ids}"}
                )
            question = found[0]
        else:
            if self._position >= len(self._order):
                self._shuffle()
            question = self._order[self._position]
            self._position += 1
        self._question = question
        self._state = FinQAState(
            episode_id=self._state.episode_id,
            question_id=question["id"],
            current_question=question["question"],
            current_company=question["company"],
            max_steps=self.max_steps,
        )
        return Observation(
            done=False,
            reward=0.0,
            metadata={
                "question": question["question"],
                "company": question["company"],
                "question_id": question["id"],
                "available_tools": list(AVAILABLE_TOOLS),
                "step_count": 0,
                "max_steps": self.max_steps,
            },
        )

    def _shuffle(self) -> None:
        self._order = list(self.questions)
        self._rng.shuffle(self._order)
        self._position = 0

    # --- tool helpers ---------------------------------------------------------------------------

    def _begin_call(self) -> None:
        """Count a tool call; refuse it when there is no episode running."""
        self._ended_by_last_call = False
        if self._question is None:
            raise ValueError("no question: call reset() first")
        if self._state.done:
            raise ValueError("the episode is over: call reset() for the next question")
        self._state.tool_calls += 1
        self._state.step_count += 1
        if self._state.tool_calls >= self.max_steps:  # this call is the last one the episode gets
            self._end(reward=0.0)

    def _end(self, reward: float) -> None:
        assert self._question is not None
        self._state.done = True
        self._state.reward = reward
        self._state.ground_truth = self._question["answer"]
        self._ended_by_last_call = True

    def _submit(self, answer: str) -> Dict[str, Any]:
        assert self._question is not None
        reward = compute_reward(answer, self._question["answer"], self._question["answer_type"])
        self._state.submitted_answer = answer
        self._end(reward)
        return {
            "submitted_answer": answer,
            "correct": reward == 1.0,
            "reward": reward,
            "ground_truth": self._question["answer"],
        }

    @staticmethod
    def _company(name: str) -> Dict[str, Any]:
        wanted = name.strip().lower()
        for company in companies():
            if wanted in (company["name"].lower(), company["ticker"].lower()):
                return company
        known = ", ".join(f"{c['name']} ({c['ticker']})" for c in companies())
        raise ValueError(f"unknown company {name!r}: choose one of {known}")

    @staticmethod
    def _table(name: str) -> str:
        if name not in TABLE_DESCRIPTIONS:
            raise ValueError(f"unknown table {name!r}: choose one of {', '.join(TABLE_DESCRIPTIONS)}")
        return name

    # --- the Environment contract ---------------------------------------------------------------

    async def _after_mcp_action(self, action: Action, observation: Observation) -> Observation:
        observation = await super()._after_mcp_action(action, observation)
        if isinstance(action, CallToolAction):
            observation.reward = 0.0
            observation.done = self._state.done
            if self._ended_by_last_call:
                self._ended_by_last_call = False
                observation.reward = self._state.reward
                observation.metadata = {
                    **observation.metadata,
                    "ground_truth": self._state.ground_truth,
                    "submitted_answer": self._state.submitted_answer,
                }
                if self._state.submitted_answer is None:
                    observation.metadata["error"] = f"max steps ({self.max_steps}) reached without an answer"
        return observation

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(
            metadata={"error": f"finqa_env takes CallToolAction or ListToolsAction, not {type(action).__name__}"}
        )

    @property
    def state(self) -> FinQAState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="finqa_env",
            description="Financial questions answered with SQL tool calls over a small authored database",
            version="0.1.0",
        )

    def close(self) -> None:
        self._db.close()
        super().close()
