"""Where the healing data's chat prompts come from: a topic list and instruction templates written for this project
(part of paddle-vha, under its licence), and questions the original model writes for itself about those topics.

No prompt set is downloaded: a user healing a model on a machine without the internet gets the same data, and no
third-party licence applies to the prompts. What the model writes (its questions, its answers, its continuations) is
the model's output, under the model's own licence (SmolLM2: Apache-2.0).

    task prompts        TASKS x TOPICS ("Explain how vaccines work in simple terms.")
    self-questions      the model asked, through its chat template, for one question about a topic
                        (QUESTION_REQUEST), its sampled reply kept when it is one line ending in "?"

`held_out(prompt, excluded)` says whether a prompt is one of the evaluation's or nearly (normalized: case, spacing,
punctuation; then 80% of the words shared), so a study's held-out prompts never enter the healing data.
"""
from __future__ import annotations

import re
from typing import Iterable, List, Optional, Set

__all__ = ["TOPICS", "TASKS", "QUESTION_REQUEST", "task_prompts", "question_requests", "parse_question",
           "normalize", "held_out", "excluded_set"]

TOPICS = (
    # everyday life
    "cooking rice", "baking bread", "making coffee", "keeping houseplants alive", "saving money", "budgeting for a family",
    "learning to swim", "riding a bicycle", "cleaning a kitchen", "moving to a new city", "planning a birthday party",
    "writing a job application", "preparing for an interview", "getting enough sleep", "morning routines",
    "walking a dog", "caring for a cat", "packing for a trip", "taking public transport", "recycling at home",
    # health and the body
    "drinking enough water", "the benefits of exercise", "stretching before running", "a balanced diet",
    "the common cold", "how vaccines work", "washing hands", "stress at work", "the human heart", "the immune system",
    "healthy teeth", "reading food labels",
    # science and nature
    "photosynthesis", "the water cycle", "volcanoes", "earthquakes", "the phases of the moon", "the solar system",
    "gravity", "magnets", "electricity in a house", "rainbows", "clouds and rain", "the seasons", "bees and flowers",
    "how birds migrate", "dinosaurs", "the ocean tides", "climate change", "renewable energy", "the speed of light",
    "atoms and molecules", "DNA", "evolution", "black holes", "the Amazon rainforest", "deserts", "coral reefs",
    # history and society
    "the ancient Egyptians", "the Roman Empire", "the printing press", "the industrial revolution", "the first flight",
    "the invention of the telephone", "the history of the Olympic Games", "castles in the Middle Ages",
    "the Silk Road", "democracy", "voting", "the United Nations", "money and banks", "taxes", "libraries",
    # geography and travel
    "the capital cities of Europe", "mountains", "rivers of the world", "Japan", "Italy", "Brazil", "Canada", "Egypt",
    "India", "Australia", "traveling by train", "learning a new language", "time zones", "maps and compasses",
    # technology
    "how the internet works", "email etiquette", "passwords and online safety", "smartphones", "computer programming",
    "writing a Python function", "spreadsheets", "artificial intelligence", "robots", "electric cars", "3D printing",
    "backing up files", "social media", "video games",
    # arts, language and ideas
    "writing a short story", "poetry", "painting with watercolors", "learning the guitar", "classical music",
    "famous novels", "Shakespeare", "the meaning of friendship", "being kind", "making decisions", "public speaking",
    "teamwork", "learning from mistakes", "grammar and punctuation", "synonyms and antonyms", "idioms in English",
    # numbers and reasoning
    "fractions", "percentages", "simple interest", "measuring length", "units of weight", "telling the time",
    "probability with dice", "prime numbers", "the area of a rectangle", "averages", "converting temperatures",
    # work and business
    "starting a small business", "customer service", "writing a polite email", "running a meeting",
    "time management", "negotiating a salary", "marketing a product", "working from home",
    # sport and leisure
    "football", "tennis", "chess", "running a marathon", "yoga", "gardening", "camping", "fishing", "photography",
    "board games", "hiking safely", "reading for pleasure",
)

TASKS = (
    "Explain {topic} in simple terms.",
    "What should a beginner know about {topic}?",
    "Give me three practical tips about {topic}.",
    "Write a short paragraph about {topic}.",
    "What is a common misconception about {topic}?",
    "How would you explain {topic} to a ten-year-old?",
    "What are the advantages and disadvantages of {topic}?",
    "Write a short poem about {topic}.",
    "Summarize the most important facts about {topic}.",
    "Why does {topic} matter?",
    "Give an example that shows {topic} in everyday life.",
    "Write a friendly message to a friend about {topic}.",
    "List a few questions people often ask about {topic}, with short answers.",
    "What are the first steps to get started with {topic}?",
    "Describe {topic} in two sentences.",
    "Tell me an interesting fact about {topic}.",
)

QUESTION_REQUEST = ("Write one question that a curious person might ask about {topic}. "
                    "Reply with the question only.")


def task_prompts(rng) -> List[str]:
    """Every TASKS x TOPICS prompt once, in the order of `rng` (a numpy Generator)."""
    prompts = [t.format(topic=topic) for t in TASKS for topic in TOPICS]
    return [prompts[i] for i in rng.permutation(len(prompts))]


def question_requests(rng, count: int) -> List[str]:
    """`count` QUESTION_REQUESTs over the topics, each topic as often as the others (cycled in `rng`'s order)."""
    out: List[str] = []
    while len(out) < count:
        out += [QUESTION_REQUEST.format(topic=TOPICS[i]) for i in rng.permutation(len(TOPICS))]
    return out[:count]


def parse_question(reply: str) -> Optional[str]:
    """The question in a model's reply to QUESTION_REQUEST: the first quoted text ending in "?" in its first non-empty
    line, else that whole line (a "Question:" label dropped), kept when it ends in "?" and is 3 to 40 words; None
    otherwise (the reply is dropped)."""
    line = next((x.strip() for x in reply.splitlines() if x.strip()), "")
    quoted = re.search(r"[\"\u201c]([^\"\u201c\u201d]+\?)[\"\u201d]", line)
    if quoted:
        line = quoted.group(1).strip()
    line = re.sub(r"^(the\s+)?(question|q)\s*[:.]\s*", "", line, flags=re.IGNORECASE).strip().strip('"\u201c\u201d*').strip()
    words = line.split()
    if not line.endswith("?") or not 3 <= len(words) <= 40:
        return None
    return line


def normalize(prompt: str) -> str:
    """Lower case, letters and digits only, single spaces: the form two prompts are compared in."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", prompt.lower()).split())


def held_out(prompt: str, excluded: Set[str], overlap: float = 0.8) -> bool:
    """Whether `prompt` is one of `excluded` (a set of normalize()d prompts) or nearly (its words and one's share at
    least `overlap` of their union: "What is the capital city of France?" is "What is the capital of France?")."""
    norm = normalize(prompt)
    if norm in excluded:
        return True
    words = set(norm.split())
    return any(len(words & set(e.split())) >= overlap * len(words | set(e.split())) for e in excluded)


def excluded_set(prompts: Iterable[str]) -> Set[str]:
    return {normalize(p) for p in prompts if p.strip()}
