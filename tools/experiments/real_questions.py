"""The held-out evaluation sets of the healing study (docs/study/heal.md), kept out of every healing data set
(tools/make_heal_data.py --exclude, written by `write_exclude`):

    HELDOUT_CHAT   chat prompts never used for healing: teacher-forced agreement with, and KL on, the original's greedy
                   answers (real_eval.PROMPTS, the 20 of docs/study/real_model.md, are held out the same way)
    QUESTIONS      checkable questions with one right answer (capitals, arithmetic, authors, units, science, language):
                   a greedy answer (<= 48 tokens, through the chat template) scores when it contains one of the item's
                   accepted answers as a whole word, case-insensitive (`correct`)

Written for this project from common knowledge; the answers are facts, checked by hand.
"""
from __future__ import annotations

import re
from typing import Iterable, List, Sequence, Tuple

__all__ = ["HELDOUT_CHAT", "QUESTIONS", "correct", "write_exclude"]

HELDOUT_CHAT = [
    "How do I make a cup of tea?",
    "What is a good way to start learning to draw?",
    "Explain what a volcano is to a child.",
    "Give me two ideas for a rainy afternoon.",
    "Why do leaves change color in autumn?",
    "What is the difference between weather and climate?",
    "Write a two-line poem about winter.",
    "How can I fall asleep faster?",
    "What should I pack for a day at the beach?",
    "Describe the taste of a lemon.",
    "What makes a good friend?",
    "How does a refrigerator keep food cold?",
    "Suggest a healthy breakfast.",
    "What is the purpose of a seatbelt?",
    "Explain what an email attachment is.",
    "Why should we recycle plastic?",
    "What do bees make?",
    "Give me a tip for remembering names.",
    "Write a thank-you note to a teacher.",
    "What is a noun?",
    "How do plants drink water?",
    "What is the main job of the lungs?",
    "Describe a sunset in one sentence.",
    "What can I cook with eggs and cheese?",
    "Why do we have night and day?",
    "What is a budget?",
    "How do you say thank you in French?",
    "Give me a fun fact about elephants.",
    "What is the first thing to do when you cut your finger?",
    "Explain why exercise is good for the brain.",
]

# (question, accepted answers): an answer scores when any accepted string appears in it as a whole word
QUESTIONS: List[Tuple[str, Sequence[str]]] = [
    # capitals
    ("What is the capital of Italy?", ["Rome"]),
    ("What is the capital of Japan?", ["Tokyo"]),
    ("What is the capital of Germany?", ["Berlin"]),
    ("What is the capital of Spain?", ["Madrid"]),
    ("What is the capital of the United Kingdom?", ["London"]),
    ("What is the capital of Canada?", ["Ottawa"]),
    ("What is the capital of Egypt?", ["Cairo"]),
    ("What is the capital of Russia?", ["Moscow"]),
    ("What is the capital of China?", ["Beijing"]),
    ("What is the capital of Greece?", ["Athens"]),
    ("What is the capital of Portugal?", ["Lisbon"]),
    ("What is the capital of Ireland?", ["Dublin"]),
    # arithmetic
    ("What is 2 plus 3?", ["5", "five"]),
    ("What is 10 minus 4?", ["6", "six"]),
    ("What is 6 times 7?", ["42", "forty-two", "forty two"]),
    ("What is 9 times 9?", ["81", "eighty-one", "eighty one"]),
    ("What is 100 divided by 4?", ["25", "twenty-five", "twenty five"]),
    ("What is 15 plus 27?", ["42", "forty-two", "forty two"]),
    ("What is half of 50?", ["25", "twenty-five", "twenty five"]),
    ("What is 3 squared?", ["9", "nine"]),
    ("What is 20 percent of 100?", ["20", "twenty"]),
    ("What is 8 plus 8?", ["16", "sixteen"]),
    # authors
    ("Who wrote Romeo and Juliet?", ["Shakespeare"]),
    ("Who wrote Hamlet?", ["Shakespeare"]),
    ("Who wrote Emma, the novel about Emma Woodhouse?", ["Austen"]),
    ("Who wrote Oliver Twist?", ["Dickens"]),
    ("Who wrote A Christmas Carol?", ["Dickens"]),
    ("Who wrote War and Peace?", ["Tolstoy"]),
    ("Who wrote the Harry Potter books?", ["Rowling"]),
    ("Who wrote Nineteen Eighty-Four?", ["Orwell"]),
    ("Who wrote The Adventures of Tom Sawyer?", ["Twain"]),
    ("Who wrote Don Quixote?", ["Cervantes"]),
    # units and measures
    ("How many centimeters are in a meter?", ["100", "one hundred", "a hundred"]),
    ("How many grams are in a kilogram?", ["1000", "1,000", "one thousand", "a thousand"]),
    ("How many minutes are in an hour?", ["60", "sixty"]),
    ("How many seconds are in a minute?", ["60", "sixty"]),
    ("How many days are in a week?", ["7", "seven"]),
    ("How many hours are in a day?", ["24", "twenty-four", "twenty four"]),
    ("How many months are in a year?", ["12", "twelve"]),
    ("How many meters are in a kilometer?", ["1000", "1,000", "one thousand", "a thousand"]),
    ("At what temperature in Celsius does water freeze?", ["0", "zero"]),
    ("How many legs does a spider have?", ["8", "eight"]),
    # science and nature
    ("What gas do plants take in from the air for photosynthesis?", ["carbon dioxide", "CO2"]),
    ("What is the closest star to the Earth?", ["Sun"]),
    ("What planet is known as the Red Planet?", ["Mars"]),
    ("What is the largest planet in our solar system?", ["Jupiter"]),
    ("What is the chemical symbol for water?", ["H2O"]),
    ("What organ pumps blood through the body?", ["heart"]),
    ("What is frozen water called?", ["ice"]),
    ("What do caterpillars turn into?", ["butterfly", "butterflies", "moth", "moths"]),
    ("What is the tallest animal in the world?", ["giraffe", "giraffes"]),
    ("What is the largest mammal?", ["blue whale", "whale"]),
    # language and general knowledge
    ("What is the opposite of hot?", ["cold"]),
    ("What is the plural of mouse?", ["mice"]),
    ("What color do you get when you mix blue and yellow?", ["green"]),
    ("How many continents are there?", ["7", "seven"]),
    ("What is the longest river in Africa?", ["Nile"]),
    ("Which ocean lies between Europe and North America?", ["Atlantic"]),
    ("What language is mainly spoken in Mexico?", ["Spanish"]),
    ("In which country are the pyramids of Giza?", ["Egypt"]),
]


def correct(answer: str, accepted: Iterable[str]) -> bool:
    """Whether `answer` contains one of `accepted` as a whole word (case-insensitive)."""
    for a in accepted:
        if re.search(r"(?<![A-Za-z0-9])" + re.escape(a) + r"(?![A-Za-z0-9])", answer, flags=re.IGNORECASE):
            return True
    return False


def write_exclude(path: str, also: Iterable[str] = ()) -> int:
    """Every held-out prompt (HELDOUT_CHAT, the QUESTIONS, and `also`) one per line; returns the count."""
    prompts = list(also) + HELDOUT_CHAT + [q for q, _ in QUESTIONS]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(prompts) + "\n")
    return len(prompts)
