"""The LLM endpoint: any OpenAI-compatible chat-completions server, through the ``openai``
client (OpenAI, vLLM, Ollama, llama.cpp's server, ...).

``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` come from the environment (the key may be any
string for a local server); the model from ``--llm-model`` or ``SOLBOUND_LLM_MODEL``.
Requests are not streamed. Timeouts, connection errors, HTTP 408, 409, 429 and 5xx are
retried by the client itself, with exponential backoff that honours ``Retry-After``
(``max_retries``); whatever still fails is one line naming the endpoint.
"""

from __future__ import annotations

import os

from ..contract import FrontendError

MODEL_ENV = "SOLBOUND_LLM_MODEL"


class AgentError(FrontendError):
    """The endpoint cannot be used (unreachable, no such model, refused); one line."""


class Endpoint:
    """One chat-completions endpoint and model. ``chat(messages)`` returns the reply's
    text and why it ended (``stop``, ``length``, ...)."""

    def __init__(self, model: str | None = None, base_url: str | None = None,
                 api_key: str | None = None, timeout: float = 300.0, max_retries: int = 4):
        self.model = model or os.environ.get(MODEL_ENV)
        if not self.model:
            raise AgentError(f"--agent needs a model: --llm-model NAME or {MODEL_ENV}")
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if not self.base_url:
                raise AgentError("--agent: set OPENAI_API_KEY (and OPENAI_BASE_URL for a "
                                 "server other than OpenAI's; any key for a local server)")
            key = "unused"               # a local server that checks no key
        try:
            import openai
        except ImportError:
            raise AgentError("--agent needs the openai client: pip install "
                             "'solbound[agent]'") from None
        self._openai = openai
        self.client = openai.OpenAI(base_url=self.base_url, api_key=key, timeout=timeout,
                                    max_retries=max_retries)
        self.where = self.base_url or "https://api.openai.com/v1"
        self.requests = 0

    def chat(self, messages: list[dict]) -> tuple[str, str]:
        oa = self._openai
        self.requests += 1
        try:
            r = self.client.chat.completions.create(model=self.model, messages=messages,
                                                    stream=False)
        except oa.APITimeoutError:
            raise AgentError(f"the LLM endpoint {self.where} did not answer in time "
                             f"(retried)") from None
        except oa.APIConnectionError as e:
            raise AgentError(f"cannot reach the LLM endpoint {self.where}: "
                             f"{_first(e.__cause__ or e)}") from None
        except oa.NotFoundError as e:
            raise AgentError(f"the LLM endpoint {self.where} has no model {self.model!r} "
                             f"(HTTP 404: {_first(_message(e))}; is the model served, and "
                             f"does the URL end in /v1?)") from None
        except oa.AuthenticationError as e:
            raise AgentError(f"the LLM endpoint {self.where} refused the key (HTTP 401: "
                             f"{_first(_message(e))}); set OPENAI_API_KEY") from None
        except oa.APIStatusError as e:
            raise AgentError(f"the LLM endpoint {self.where} answered HTTP {e.status_code} "
                             f"(after retries): {_first(_message(e))}") from None
        except oa.APIError as e:
            raise AgentError(f"the LLM endpoint {self.where} sent no usable reply: "
                             f"{_first(e)}") from None
        if not getattr(r, "choices", None):
            raise AgentError(f"the LLM endpoint {self.where} sent a reply with no choices")
        choice = r.choices[0]
        content = choice.message.content or ""
        if not isinstance(content, str):       # a server that sends content parts
            content = "".join(p.get("text", "") if isinstance(p, dict) else
                              str(getattr(p, "text", p)) for p in content)
        return content, (choice.finish_reason or "")


def _message(e) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return str(getattr(e, "message", e))


def _first(e) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else type(e).__name__
