"""Word material for the offline tasks: seeded pseudo-words and a few small built-in lists.

RULER draws its keys from the `wonderwords` package and its haystacks from downloaded essays; we need neither.
Keys are "{adjective}-{noun}" from the short lists below (RULER's shape, e.g. `capable-radiosonde`); names,
coded words and common-word vocabularies are pseudo-words from a syllable generator, so any number of distinct
words can be drawn without a system word list. Every function takes its `random.Random`: there is no global state.
"""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Collection, Sequence

NOISE_LINE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
"""RULER's `noise` haystack line (one per line, repeated), also the filler of its variable-tracking task."""

ADJECTIVES = (
    "able", "agile", "amber", "ancient", "bitter", "bold", "brave", "breezy", "bright", "calm", "careful",
    "cheerful", "clever", "cloudy", "cold", "crisp", "curious", "daring", "dusty", "eager", "early", "electric",
    "elegant", "empty", "fancy", "fierce", "flat", "fragile", "free", "fresh", "gentle", "giant", "glad",
    "golden", "grand", "gray", "hidden", "hollow", "honest", "humble", "icy", "idle", "jolly", "keen", "kind",
    "late", "lazy", "little", "lively", "lonely", "loud", "lucky", "mellow", "merry", "mighty", "misty",
    "modern", "narrow", "noble", "odd", "old", "pale", "patient", "plain", "polite", "proud", "quick", "quiet",
    "rapid", "rare", "rough", "round", "royal", "rusty", "salty", "sharp", "shiny", "silent", "silver",
    "simple", "sleepy", "slow", "smooth", "soft", "solid", "sour", "spicy", "steady", "stormy", "strange",
    "sunny", "sweet", "swift", "tall", "tame", "tender", "tidy", "tiny", "vast", "warm", "wild", "wise",
    "witty", "young", "zealous",
)  # fmt: skip
"""Adjectives for NIAH word keys."""

NOUNS = (
    "anchor", "apple", "arrow", "badge", "banner", "barrel", "basket", "beacon", "bell", "bench", "blanket",
    "bottle", "bridge", "bucket", "cabin", "camera", "candle", "canyon", "carpet", "castle", "cellar", "chair",
    "channel", "cloud", "comet", "compass", "cottage", "crystal", "desert", "dragon", "drum", "falcon",
    "feather", "fence", "forest", "fountain", "garden", "glacier", "guitar", "hammer", "harbor", "helmet",
    "island", "jacket", "jungle", "kettle", "ladder", "lantern", "lemon", "library", "lizard", "magnet",
    "marble", "meadow", "mirror", "monkey", "needle", "oasis", "orchard", "otter", "palace", "parrot",
    "pebble", "pencil", "pepper", "pillow", "planet", "pocket", "puzzle", "rabbit", "radio", "ribbon",
    "river", "rocket", "saddle", "scarf", "shadow", "shelter", "signal", "spider", "spoon", "statue",
    "strawberry", "summit", "teapot", "ticket", "tiger", "tower", "tractor", "trumpet", "tunnel", "valley",
    "violin", "wagon", "walnut", "whistle", "window", "wizard", "zebra",
)  # fmt: skip
"""Nouns for NIAH word keys."""

KV_KEYS = (
    "ant", "bat", "cat", "cow", "dog", "elk", "fox", "hen", "owl", "pig", "rat", "yak",
    "bee", "emu", "gnu", "jay", "ram", "eel", "ape", "koi",
)  # fmt: skip
"""Short key names of the tiny demo's key-value tasks (the first `num_keys` are used)."""

KV_FILLER = (
    "the sun is up.",
    "the sky is blue.",
    "the sea is calm.",
    "a bird can fly.",
    "the tree is tall.",
    "a fish can swim.",
    "the road is long.",
    "the day is warm.",
)
"""Filler lines of the tiny demo's tasks: a closed vocabulary of a dozen words and no digits, so a 512-token
model sees few distinct strings and a key-value line stands out."""

_ONSETS = ("b", "br", "c", "ch", "d", "dr", "f", "g", "gr", "h", "j", "k", "l", "m", "n", "p", "pr", "r",
           "s", "sh", "st", "t", "th", "tr", "v", "w", "z")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou")
_CODAS = ("", "", "", "l", "m", "n", "r", "s", "th", "x")


def pseudo_word(rng: random.Random, *, min_syllables: int = 2, max_syllables: int = 3) -> str:
    """A pronounceable lowercase pseudo-word, e.g. "dreavol": onset + vowel + optional coda per syllable."""
    syllables = rng.randint(min_syllables, max_syllables)
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def distinct_pseudo_words(
    rng: random.Random,
    count: int,
    *,
    exclude: Collection[str] = (),
    min_syllables: int = 2,
    max_syllables: int = 3,
) -> list[str]:
    """`count` distinct pseudo-words, none in `exclude`, in draw order."""
    seen = set(exclude)
    words: list[str] = []
    while len(words) < count:
        word = pseudo_word(rng, min_syllables=min_syllables, max_syllables=max_syllables)
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


class NameSource:
    """Capitalized pseudo-word names that never repeat within one sample (one person, city or country each)."""

    def __init__(self, rng: random.Random, used: set[str] | None = None) -> None:
        self.rng = rng
        self.used: set[str] = set() if used is None else used
        """Names taken so far; pass another source's set to share it (two draw streams, one namespace)."""

    def take(self, suffix: str = "") -> str:
        """A fresh capitalized name, with `suffix` appended (e.g. "ia" for a country)."""
        while True:
            name = pseudo_word(self.rng).capitalize() + suffix
            if name not in self.used:
                self.used.add(name)
                return name


def word_key(rng: random.Random) -> str:
    """A RULER-style word key "{adjective}-{noun}" (about 10,000 combinations)."""
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def seeded_uuid(rng: random.Random) -> str:
    """A version-4 UUID string from the seeded generator (RULER uses uuid4 from `getrandbits(128)`)."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def seven_digit_number(rng: random.Random) -> str:
    """A 7-digit number without a leading zero, RULER's NIAH `numbers` value."""
    return str(rng.randint(1_000_000, 9_999_999))


def random_letters(rng: random.Random, length: int, *, upper: bool = False) -> str:
    """`length` random ASCII letters (RULER's variable names are 5 uppercase, its coded words 6 lowercase)."""
    alphabet = string.ascii_uppercase if upper else string.ascii_lowercase
    return "".join(rng.choice(alphabet) for _ in range(length))


def join_and(items: Sequence[str]) -> str:
    """RULER's list phrasing: "a", "a and b", "a, b, and c"."""
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + ", and " + items[-1]


def sample_rng(task: str, seed: int, index: int, part: str = "") -> random.Random:
    """The generator of one sample (one `part` of it): seeded from a string, so sample i is the same whatever
    `num_samples` is, and independent of every other sample and task (str seeds are hashed with SHA-512)."""
    return random.Random(f"{task}/{seed}/{index}/{part}")
