"""The chat loop: read a message or a command, stream the reply, print its status line.

Ctrl-C while a reply streams stops it; the partial reply stays in the conversation (and
``/retry`` asks again). Ctrl-C at the prompt clears the line; Ctrl-D or ``/exit`` quits.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.text import Text

from flint.api import LLM
from flint.chat.commands import Action, ChatState, run_command
from flint.chat.config import Settings
from flint.chat.render import ReplyView
from flint.chat.session import Conversation, Prompt, build_prompt
from flint.chat.stats import ReplyMeter, read_cache_stats, status_line
from flint.chat.think import split_reply
from flint.harmony import is_harmony

DEFAULT_RESERVE = 256  # positions kept free for a reply when old messages are left out


class ChatApp:
    """One chat session over a loaded ``LLM``."""

    def __init__(
        self,
        llm: LLM,
        console: Console,
        read: Callable[[], str],
        settings: Settings,
        *,
        system: str | None = None,
        hide_thinking: bool = False,
    ) -> None:
        self.llm, self.console, self.read = llm, console, read
        self.hide_thinking = hide_thinking
        templated = llm.tokenizer.chat_template is not None
        self.state = ChatState(console, Conversation(system=system), settings, templated)
        self._rng: random.Random | None = None
        self._rng_seed: int | None = None

    @property
    def context_size(self) -> int:
        return self.llm.model.context_length

    def run(self) -> None:
        while True:
            try:
                line = self.read()
            except KeyboardInterrupt:
                continue  # Ctrl-C at the prompt drops the line, as shells do
            except EOFError:
                return
            action = self.handle(line)
            if action is Action.EXIT:
                return
            if action is Action.REPLY:
                self.reply()

    def handle(self, line: str) -> Action:
        """What to do with one input: a command, a message, or (base model) Enter alone
        to continue the text."""
        if line.startswith("/") and not line.startswith("//"):
            return run_command(self.state, line)
        if line.startswith("//"):
            line = line[1:]  # "//x" sends "/x"
        if not line.strip():
            continues = not self.state.templated and bool(self.state.conv.messages)
            return Action.REPLY if continues else Action.NONE
        self.state.conv.add("user", line)
        return Action.REPLY

    def _next_seed(self) -> int | None:
        """A seed per reply, drawn from one generator seeded with --seed: a session is
        reproducible, yet /retry gives a new reply."""
        seed = self.state.settings.seed
        if seed is None:
            return None
        if self._rng is None or self._rng_seed != seed:
            self._rng, self._rng_seed = random.Random(seed), seed
        return self._rng.getrandbits(63)

    def _prompt(self) -> Prompt | None:
        s, ctx = self.state.settings, self.context_size
        reserve = max(1, min(s.max_tokens or DEFAULT_RESERVE, ctx // 4))
        try:
            return build_prompt(self.state.conv, self.llm.tokenizer, ctx, reserve, s.thinking)
        except ValueError as err:
            self.console.print(Text(str(err), style="red"))
            if self.state.conv.messages[-1:] and self.state.conv.messages[-1]["role"] == "user":
                self.state.conv.messages.pop()  # not answered: it would stay unanswered
            return None

    def _options(self, prompt: Prompt) -> dict[str, Any]:
        s = self.state.settings
        room = self.context_size - len(prompt.ids)
        return {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "max_tokens": min(s.max_tokens or room, room),
            "seed": self._next_seed(),
        }

    @property
    def _harmony(self) -> bool:
        """GPT-OSS's channels in the replies (its template writes them)."""
        return is_harmony(self.llm.tokenizer.chat_template)

    def reply(self) -> None:
        prompt = self._prompt()
        if prompt is None:
            return
        view = ReplyView(
            self.console,
            markdown=self.state.templated,
            hide_thinking=self.hide_thinking,
            in_think=prompt.in_think,
            harmony=self._harmony,
        )
        meter = ReplyMeter()
        # The previous turn's KV cache holds this prompt's prefix: prefill only the rest.
        stream = self.llm.stream(prompt.ids, reuse_prefix=True, **self._options(prompt))
        try:
            with view:
                for chunk in stream:
                    meter.add(chunk)
                    view.feed(chunk.text)
        except KeyboardInterrupt:
            pass  # the view said so; the partial reply is kept below
        finally:
            close = getattr(stream, "close", None)  # a generator: release it now
            if callable(close):
                close()
        self._record(prompt, meter)

    def _record(self, prompt: Prompt, meter: ReplyMeter) -> None:
        text = meter.text
        reasoning, answer = split_reply(text, prompt.in_think, self._harmony)
        if text and self._harmony:
            # the template writes the channels itself; a reply cut off inside the
            # analysis channel still takes its turn (empty), so turns keep alternating
            self.state.conv.add("assistant", answer)
        elif text:
            self.state.conv.add("assistant", text)
        self.state.reasoning = reasoning
        cache = read_cache_stats(self.llm)
        self.state.last = meter.stats(len(prompt.ids), self.context_size, prompt.dropped, cache)
        self.console.print(Text(status_line(self.state.last), style="dim"))
