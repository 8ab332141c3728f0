r"""Pull the boxed answer out of a model response: the argument of the LAST `\boxed` or `\fbox`.

MemAgent's training verifier (verl/utils/reward_score/hotpotqa.py, after the MATH `last_boxed_only_string`)
rfinds the last `\boxed`, falls back to `\fbox`, and brace-matches its argument; a `"\boxed "` anywhere makes it
take the text after the last `"\boxed "` up to the next `$` instead. We keep the idea and make the rules uniform:

1. The command is `\boxed` or `\fbox` not followed by an ASCII letter (TeX ends a control word at the first
   non-letter, so `\boxedtext{x}` is a different command). The occurrence that starts last wins, whichever
   of the two names it has; in `\boxed{\boxed{a}}` that is the inner one, as with MemAgent's rfind.
2. Braced form: `\boxed{...}`, also with whitespace before the brace (`\boxed {x}`, which TeX allows). The
   content runs to the matching close brace. A backslash escapes the next character, so `\{`, `\}` and `\\`
   never open or close a group (`\boxed{\{1\}}` gives `\{1\}`). Returned verbatim, not trimmed.
3. Bare form: the command, at least one whitespace character, then a token: everything up to the next
   whitespace, `$` or the end of the text (`$\boxed 42$` gives `42`).
4. Otherwise None: no command; an unclosed brace (`\boxed{a` gives None even if an earlier box is complete:
   the last box is the answer, and a cut-off answer is no answer); or no argument in either form
   (`\boxed`, `\boxed$`, and also `\boxed7`, since the bare form needs the whitespace).

We drop MemAgent's "last 300 characters" window: our rule (docs/workflow.md, Verifiers) is the last box of the whole answer.

Every step is a single left-to-right regex scan whose patterns cannot backtrack (a literal alternation with
a one-character look-ahead, a character class, a two-character escape token), so the cost is linear in the
text length: a 1 MB input of `{` or `\boxed` soup takes a fraction of a second.
"""

import re
from collections import deque

from memagent.verify.checks import require_str

_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# One token of a braced group: an escape pair (backslash + any character, newlines included) or a brace.
_GROUP_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)
_SPACES = re.compile(r"\s*")
_BARE_TOKEN = re.compile(r"[^\s$]+")


def extract_boxed(text: str) -> str | None:
    r"""Return the argument of the last `\boxed` / `\fbox` in `text`, or None (rules in the module docstring).

    >>> extract_boxed(r"so \boxed{1} or rather \boxed{\frac{1}{2}}")
    '\\frac{1}{2}'
    >>> extract_boxed(r"$\boxed 7$"), extract_boxed(r"\boxed{7"), extract_boxed("7")
    ('7', None, None)
    """
    require_str(text, "text")
    tail = deque(_COMMAND.finditer(text), maxlen=1)  # keeps only the last match, in one pass
    if not tail:
        return None
    last = tail[0]
    after_spaces = _SPACES.match(text, last.end()).end()
    if after_spaces < len(text) and text[after_spaces] == "{":
        return _braced_group(text, after_spaces)
    if after_spaces == last.end():  # `\boxed}` / `\boxed$` / `\boxed` at the end: no argument
        return None
    token = _BARE_TOKEN.match(text, after_spaces)
    return None if token is None else token.group()


def _braced_group(text: str, open_at: int) -> str | None:
    """Content between text[open_at] == "{" and its matching "}", or None if the group never closes."""
    depth = 0
    for token in _GROUP_TOKEN.finditer(text, open_at):
        mark = token[0]
        if mark == "{":
            depth += 1
        elif mark == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : token.start()]
    return None
