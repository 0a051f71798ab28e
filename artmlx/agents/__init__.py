"""Built-in ART-style agents: `async def rollout(client, scenario)` functions that `artmlx run --rollout`
and `MLXBackend` users can run as they are, each the agent form of a built-in environment."""
