"""The agent frontend: an LLM writes the loop IR for what no tracer reads (a numpy program,
an operator a frontend cannot lower), and nothing is trusted until it validates.

``prompt.py`` (the prompt, from the IR's own tables), ``endpoint.py`` (an OpenAI-compatible
chat-completions endpoint through the ``openai`` client), ``translate.py`` (generate, then
verify), ``cache.py`` (accepted translations between runs), ``splice.py`` (accepted IR into
a program)."""
