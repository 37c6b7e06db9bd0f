"""Shared fixtures. Every async test fails if it leaves asyncio tasks behind."""

from __future__ import annotations

import asyncio

import pytest
from task_leaks import fail_on_leaked_tasks


@pytest.fixture(autouse=True)
async def no_leaked_tasks():
    before = set(asyncio.all_tasks())
    yield
    await fail_on_leaked_tasks(before, tries=20)
