"""Rollout: sampling, the KV-cache generation engine, agents and the MemAgent workflow."""

from memagent.records import ChatRequest, Completion, Conversation, Trajectory
from memagent.rollout.agents import AgentResult, single_turn_agent
from memagent.rollout.chunking import center_truncate, iter_chunks, tokenize_document
from memagent.rollout.generate import GenerateOutput, generate
from memagent.rollout.llm import LLM, LocalLLM
from memagent.rollout.prompts import WorkflowConfig
from memagent.rollout.sampling import SamplingParams
from memagent.rollout.scheduler import run_agents
from memagent.rollout.tool_agent import calculator_agent
from memagent.rollout.workflow import memagent_agent, run_memagent

__all__ = [
    "LLM",
    "AgentResult",
    "ChatRequest",
    "Completion",
    "Conversation",
    "GenerateOutput",
    "LocalLLM",
    "WorkflowConfig",
    "SamplingParams",
    "Trajectory",
    "calculator_agent",
    "center_truncate",
    "generate",
    "iter_chunks",
    "memagent_agent",
    "run_agents",
    "run_memagent",
    "single_turn_agent",
    "tokenize_document",
]
