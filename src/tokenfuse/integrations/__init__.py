"""One-line guards for agent frameworks that own their HTTP clients.

Each module guards one framework and imports it only when called; install the framework with
its tokenfuse extra (``pip install 'tokenfuse[litellm]'``):

* ``tokenfuse.integrations.langchain.guard_langchain(llm)``: ``ChatOpenAI`` / ``ChatAnthropic``
  (both clients, and ``stream_usage`` on), also inside LangGraph agents;
* ``tokenfuse.integrations.litellm.guard_litellm()``: every provider's client, refusals that
  neither retry nor cool a Router deployment down;
* ``tokenfuse.integrations.openai_agents.guard_openai_agents()``: the default OpenAI client;
* ``tokenfuse.integrations.pydantic_ai.guard_pydantic_ai(model_or_provider)``;
* ``tokenfuse.integrations.genai.guard_genai(http_options)``: ``google.genai`` clients.

Every helper takes ``fuse=`` (default: ``tokenfuse.default_fuse()``) and ``key=`` (who the calls
are counted for, as in ``FuseTransport``); ``tokenfuse.scope("agent-42")`` names the agent of a
block of code and wins over both.
"""

# The guards live in one submodule per framework, so that importing one never imports another.
__all__: list[str] = []
