"""Run the agent with `python -m vipu.agent`."""

from vipu.agent.main import main

main()
