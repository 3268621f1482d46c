"""The numpy frontend: a program no tracer reads, translated by the agent
(``frontends/agent``) and accepted only when its IR matches the program's outputs."""
