"""Labeled next states made from templates: training data for the trained judge head.

Each case is a :class:`~clawrl.judge.cases.JudgeCase` (request, answer, next state, score, hint)
assembled from phrase pools: a person's reply (praise, acceptance followed by a new request,
polite or blunt change requests carrying a directive, redo requests, complaints, off-topic
messages, non-committal replies) or a program's output (successful command output, errors and
tracebacks, passing and failing tests, empty outputs). Labels follow the judge's scoring rule
(:mod:`clawrl.judge.prompts`): +1 the next state shows the turn worked, -1 it failed or the user
wants it changed, 0 no evidence.

Every pool is split in two by position (even entries ``train``, odd entries ``val``), so the
``val`` cases are phrased with fragments the ``train`` cases never use: accuracy on ``val``
estimates how the head does on unseen phrasing. The held-out sets (the shipped labeled set, the
blind set) are never read here.

Surface noise is added the way people write: lower case, missing punctuation, an emoji, a
typo, a greeting, a trailing "lol".
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from clawrl.judge.cases import CaseCategory, JudgeCase
from clawrl.judge.types import (
    JudgeContext,
    JudgeInput,
    NextStateRole,
    NextStateText,
    Score,
    TurnOutput,
)

Split = Literal["train", "val", "all"]
T = TypeVar("T")

# ----------------------------------------------------------------------------- contexts

_ASSISTANT_SYSTEM = "You are a helpful assistant."
_AGENT_SYSTEM = "You are a coding agent working in the user's repository. Use the tools."

CHAT_CONTEXTS: tuple[tuple[str, str], ...] = (
    ("What's the capital of Canada?", "The capital of Canada is Ottawa."),
    (
        "Write a short poem about the sea.",
        "Grey waves fold and unfold,\nsalt on the wind,\nthe tide keeps its old promise.",
    ),
    ("How do I sort a dict by value in Python?", "Use `sorted(d.items(), key=lambda kv: kv[1])`."),
    (
        "Give me a recipe for pancakes.",
        "**Ingredients**\n1. 1 cup flour\n2. 1 egg\n3. 1 cup milk\n\nWhisk, rest 5 minutes, fry in butter.",
    ),
    (
        "A train goes 60 km/h for 2.5 hours. How far does it go?",
        "**Step 1:** distance = speed x time.\n**Step 2:** 60 x 2.5 = 150.\n\n**Final Answer:** 150 km",
    ),
    (
        "Summarize this article about solar panels.",
        "Solar panel prices fell 80% in ten years, and installations tripled.",
    ),
    (
        "Draft an email asking my landlord to fix the heater.",
        "Dear Mr. Brown,\n\nI am writing to kindly request that the heater in my flat be repaired.\n\nBest regards,\nSam",
    ),
    ("What is 15% of 240?", "15% of 240 is 36."),
    ("Translate 'good morning' into Spanish.", "'Good morning' in Spanish is 'buenos días'."),
    (
        "Explain recursion to a beginner.",
        "Recursion is when a function calls itself on a smaller piece of the problem until it reaches a simple base case.",
    ),
    (
        "Plan a 3-day trip to Rome.",
        "## Day 1\n- Colosseum\n- Forum\n## Day 2\n- Vatican\n## Day 3\n- Trastevere",
    ),
    ("Write a regex that matches an email address.", "`^[\\w.+-]+@[\\w-]+\\.[\\w.]+$`"),
    ("Suggest a name for my bakery.", "How about 'Rise & Shine Bakery'?"),
    (
        "Why is the sky blue?",
        "Sunlight scatters off air molecules, and blue light scatters the most (Rayleigh scattering).",
    ),
    ("Convert 5 miles to kilometres.", "5 miles is about 8.05 km."),
    (
        "Help me grade this essay on climate change.",
        "Grade: B. The argument is clear, but the evidence in paragraph 2 needs sources.",
    ),
    (
        "How long should I boil an egg for a runny yolk?",
        "About 6 minutes in boiling water, then straight into cold water.",
    ),
    ("Can you fix the grammar in: 'me and him goes to school'?", "'He and I go to school.'"),
    (
        "What's a good stretch for lower back pain?",
        "Try the child's pose: kneel, sit back on your heels and reach your arms forward for 30 seconds.",
    ),
    (
        "If a shirt costs $40 and is 25% off, what's the price?",
        "Step 1: 25% of 40 = 10.\nStep 2: 40 - 10 = 30.\n\n**Final Answer: $30**",
    ),
)

AGENT_CONTEXTS: tuple[tuple[str, str, str], ...] = (
    ("Run the test suite.", "bash", "pytest -q"),
    ("List the files in the project.", "bash", "ls -la"),
    ("Show me the README.", "read_file", "README.md"),
    ("Install the requests library.", "bash", "pip install requests"),
    ("Commit the changes.", "bash", "git commit -am 'Fix parser'"),
    ("Find where parse_date is defined.", "bash", "grep -rn 'def parse_date' src/"),
    ("Create a build directory.", "bash", "mkdir -p build"),
    ("Check the disk usage.", "bash", "df -h"),
    ("Run the app and see what happens.", "bash", "python app.py"),
    ("Fetch the user list from the API.", "http_get", "https://api.example.com/users"),
    ("Search the tickets for 'login bug'.", "search_tickets", "login bug"),
    ("Build the project.", "bash", "make build"),
    ("Start the dev server.", "bash", "npm run dev"),
    ("Query the orders table for today.", "sql", "SELECT * FROM orders WHERE day = CURRENT_DATE"),
    ("Rename config.yml to config.yaml.", "bash", "mv config.yml config.yaml"),
    ("Check which Python version we have.", "bash", "python --version"),
)

# ----------------------------------------------------------------------------- person replies

PRAISE = (
    "thanks!",
    "perfect, thank you",
    "that's exactly what I needed",
    "great answer",
    "awesome, thanks a lot",
    "this is great",
    "nice, that worked",
    "ty",
    "thank you so much!",
    "spot on",
    "love it",
    "brilliant",
    "works perfectly now",
    "cheers, that's it",
    "yes! thanks",
    "you're a lifesaver",
    "that makes sense now, thanks",
    "wonderful",
    "good job",
    "super helpful",
    "exactly right",
    "that did the trick",
    "lovely, thank you",
    "amazing",
    "thx",
    "great, got it",
    "nice one",
    "that's much better, thanks",
    "appreciate it",
    "yep that's correct",
    "well done",
    "this is really good",
    "ok perfect",
    "oh that's clever, thanks",
    "bang on",
    "fantastic",
    "that's right, thanks!",
    "much appreciated",
    "10/10",
    "that's helpful, cheers",
    "sweet, it works",
    "finally it works, thank you",
    "love this version",
    "this is perfect for me",
    "thank you, this is exactly it",
    "omg yes",
    "that's the one",
    "legend, thanks",
    "you nailed it",
    "great stuff",
    "ahh perfect",
    "this helps a lot",
    "oh nice, much clearer now",
    "that answers it, thanks",
    "genius",
    "works like a charm",
    "many thanks!",
    "yes that's what I meant",
    "great, it compiles now",
    "the fix worked",
    "problem solved, thanks",
    "awesome sauce",
    "huge help, thank you",
    "that's really good actually",
    "you're the best",
    "cheers mate",
    "nailed it",
    "precisely what I was after",
    "I like this a lot",
    "clear and simple, thanks",
    "thank u",
    "tysm",
    "appreciate the help!",
    "that's great, my teacher will love it",
    "looks great",
    "that's correct",
    "ok wow that worked",
    "good answer, thanks",
    "thanks heaps",
    "brilliant, thank you",
    "oh that's neat",
    "perfecto",
    "merci!",
    "danke, passt",
)
ACCEPT = (
    "ok",
    "cool",
    "got it",
    "alright",
    "sounds good",
    "great",
    "nice",
    "ok thanks",
    "makes sense",
    "perfect",
    "good",
    "okay cool",
    "right, thanks",
    "ok that works",
    "fine, thanks",
    "neat",
    "alright thanks",
    "ok great",
    "yep",
    "cool thx",
    "noted",
    "good to know",
    "fair enough",
    "ok understood",
    "roger",
    "got it, ty",
    "ok makes sense",
    "sure",
    "perfect thx",
    "nice thanks",
)
NEW_REQUESTS = (
    "now what's 20% of 80?",
    "can you also do the same for March?",
    "next question: how do I reverse a string?",
    "what about Australia?",
    "now write one about the mountains",
    "can you translate it to French too?",
    "could you do the next problem as well?",
    "now how do I do it in JavaScript?",
    "what's the capital of Peru?",
    "next: a train goes 80 km/h for 3 hours, how far?",
    "can you add a dessert to the plan?",
    "how would I test this?",
    "what should I cook tomorrow?",
    "one more: what's 7 x 8?",
    "now make a version for kids",
    "what's the time complexity of that?",
    "can you write the reply email too?",
    "how about a name for a coffee shop?",
    "and how do I undo it?",
    "now do the same for the orders table",
    "can you do a version in Spanish?",
    "how do I install it on Windows?",
    "what's the next step?",
    "can you explain the second part more?",
    "now summarize it in one line",
    "could you also check the tests?",
    "what would the unit test look like?",
    "can you make one for my sister too?",
    "how about for 4 people?",
    "what's 12 squared?",
    "next one: solve 3x + 5 = 20",
    "how do I deploy this?",
    "any tips for the presentation?",
    "can you write a tweet about it?",
    "what's the opposite word?",
    "how long does it take to cook?",
    "and what about the weekend?",
    "can you turn it into a table?",
    "what's the french for thank you?",
    "now do the same for the second file",
)
CONNECTORS = ("", " ", ". ", "! ", ", ", " - ", ". next, ", ". also ", ". ok ", "!! ")

DIRECTIVES: tuple[tuple[str, str], ...] = (
    ("don't use bullet points", "Do not use bullet points."),
    ("use metric units", "Use metric units."),
    ("keep it under 50 words", "Keep the answer under 50 words."),
    ("drop the headers", "Do not use headers."),
    ("no bold text please", "Do not use bold text."),
    ("make it more casual", "Write in a casual tone."),
    ("just give me the number", "Give only the final number."),
    ("skip the 'Final Answer' part", "Leave out the 'Final Answer' line."),
    ("write it as one paragraph", "Write one paragraph."),
    ("use python 3 syntax", "Use Python 3 syntax."),
    ("check the file before editing it", "Check the file before editing it."),
    ("the file is in src/, not lib/", "The file is in src/, not lib/."),
    ("answer in one sentence", "Answer in one sentence."),
    ("add sources for the numbers", "Cite sources for the numbers."),
    ("use a friendlier tone", "Use a friendlier tone."),
    ("don't number the steps", "Do not number the steps."),
    ("use kilometres instead of miles", "Use kilometres instead of miles."),
    ("sign it with my name, Alex", "Sign the email with the name Alex."),
    ("use tabs, not spaces", "Indent with tabs, not spaces."),
    ("explain it without jargon", "Explain it without jargon."),
    ("put the code in a single block", "Put the code in a single block."),
    ("be more specific about what's wrong", "Say specifically what is wrong."),
    ("make the title shorter", "Make the title shorter."),
    ("mention the deadline is Friday", "Mention that the deadline is Friday."),
    ("run the tests before committing", "Run the tests before committing."),
    ("use the existing helper instead of writing a new one", "Use the existing helper function."),
    ("write it in British English", "Use British English spelling."),
    ("less formal please", "Write less formally."),
    ("no emojis", "Do not use emojis."),
    ("show the working, not just the answer", "Show the working steps."),
    ("stop adding a summary at the end", "Do not add a summary at the end."),
    ("use Celsius", "Use degrees Celsius."),
    ("make it rhyme", "Make it rhyme."),
    ("keep the original variable names", "Keep the original variable names."),
    ("write dates as YYYY-MM-DD", "Write dates as YYYY-MM-DD."),
    ("don't apologize so much", "Do not apologize."),
    ("use fewer exclamation marks", "Use fewer exclamation marks."),
    ("cite the page numbers", "Cite the page numbers."),
    ("address it to the whole team", "Address it to the whole team."),
    ("use the async client", "Use the async client."),
    ("round to two decimals", "Round to two decimals."),
    ("put the answer first", "Put the answer first."),
    ("write it for a 10 year old", "Write for a 10-year-old reader."),
    ("include the imports", "Include the imports."),
    ("use double quotes", "Use double quotes."),
    ("give me three options, not one", "Give three options."),
    ("don't touch the tests", "Do not change the tests."),
    ("mention the price in euros", "Give the price in euros."),
    ("shorten it to a tweet", "Shorten it to tweet length."),
    ("avoid passive voice", "Avoid the passive voice."),
)
DIRECTIVE_FRAMES = (
    "{d}",
    "please {d}",
    "can you {d}?",
    "could you {d}?",
    "thanks, but {d}",
    "good, but please {d}",
    "hmm, {d}",
    "next time {d}",
    "I said {d}",
    "not quite - {d}",
    "{d}, thanks",
    "pls {d}",
    "thanks! could you {d} though?",
    "close, but {d}",
    "nice try but {d}",
    "wait, {d}",
    "would you mind if you {d}?",
    "ok but {d}",
    "can we {d}?",
    "one thing: {d}",
    "looks good but {d}",
    "you should {d}",
    "try to {d}",
    "I'd prefer if you {d}",
    "{d} please",
    "remember to {d}",
    "it would be better if you {d}",
    "actually, {d}",
    "almost there, just {d}",
    "can you please {d}?",
    "ugh, {d}",
    "{d}!!",
    "good start but {d}",
    "make sure you {d}",
    "love it but could you {d}?",
    "redo it and {d}",
)

REDO = (
    "try again",
    "redo it",
    "nope, again",
    "that's not it, one more time",
    "give me another version",
    "can you redo that?",
    "start over",
    "regenerate please",
    "again",
    "no, try once more",
    "let's try that again",
    "another one please",
    "do it over",
    "that's off, redo",
    "not good, give it another shot",
    "hmm no, another attempt",
    "please retry",
    "one more try",
    "give it another go",
    "try a different approach",
    "rewrite it",
    "again please",
    "can I get a new one?",
    "do over pls",
    "nah, redo",
    "that's not right, try again",
    "try harder",
    "next attempt please",
    "have another go at it",
)
SARCASM = (
    "wow this is terrible",
    "great, another wall of text",
    "oh sure, that totally works (it doesn't)",
    "amazing, you broke it again",
    "thanks, I guess",
    "nice, now nothing runs",
    "brilliant, the exact opposite of what I asked",
    "lovely, more bullet points",
    "cool cool cool, still wrong",
    "fantastic, it crashed",
    "oh great, exactly what I didn't ask for",
    "wow, so helpful (not)",
    "yeah right",
    "perfect, if I wanted it broken",
    "sure, and now nothing works",
    "impressive, it's worse",
    "thanks for making it longer I guess",
    "lol no",
)
FUTURE_FRAMES = (
    "looks good. going forward, {d}",
    "perfect, thanks! in future, {d}",
    "great job. for next time: {d}",
    "that works, thanks - from now on {d}",
    "nice! one tip for later: {d}",
    "thanks, that's right. in general, {d}",
)
COMPLAINTS = (
    "this is wrong",
    "that's not what I asked",
    "way too long",
    "too formal",
    "ugh, bullet points again",
    "why is there so much bold",
    "this doesn't work",
    "still broken",
    "you ignored my instructions",
    "wow, thanks for nothing",
    "no",
    "wrong",
    "that's incorrect, 8 x 7 is 56",
    "this reads like a robot wrote it",
    "terrible",
    "meh",
    "you didn't answer the question",
    "that's useless",
    "the code crashes",
    "the answer is off by one",
    "why so many headers?",
    "too complicated",
    "I asked for something short",
    "this makes no sense",
    "not helpful at all",
    "that broke everything",
    "seriously? again?",
    "the link is dead",
    "it still says the same error",
    "you made it worse",
    "nope",
    "that's the wrong file",
    "bad answer",
    "way off",
    "this is not what I wanted at all",
    "so much boilerplate",
    "the math is wrong",
    "hmm that's not right",
    "it didn't compile",
    "that's too vague",
    "you misspelled my name",
    "nobody talks like that",
    "the formatting is a mess",
    "this is way too complicated for a kid",
    "you used the wrong formula",
    "it's not funny at all",
    "the numbers don't add up",
    "this email sounds rude",
    "that's a lot of words for nothing",
    "the code doesn't even run",
    "you forgot the second question",
    "it's in the wrong language",
    "i hate the bullet points",
    "this looks like a robot wrote it",
    "way too many emojis",
    "that's outdated info",
    "you changed things I didn't ask you to change",
    "still wrong",
    "no that's not how it works",
    "you misunderstood me",
    "the tone is off",
    "this is boring",
    "that's not a haiku",
    "too short",
    "that's basically what I already had",
    "incorrect",
    "nah",
    "that's plagiarized from wikipedia",
    "the recipe has no quantities",
    "that's not even close",
    "it's missing the conclusion",
    "why did you delete my function?",
    "the test still fails",
)
OFF_TOPIC = (
    "what's the weather in Paris tomorrow?",
    "how do I boil an egg?",
    "who won the game last night?",
    "can you recommend a good book?",
    "what's a good name for a dog?",
    "how tall is the Eiffel tower?",
    "write me a limerick about cats",
    "what's the best way to learn guitar?",
    "tell me a joke",
    "how many ounces in a pound?",
    "what year did the Berlin wall fall?",
    "what model are you?",
    "do you know any good podcasts?",
    "what should I watch tonight?",
    "how do plants make food?",
    "what's the time in Tokyo?",
    "how do I make cold brew?",
    "who wrote Hamlet?",
    "is it going to rain today?",
    "what's a good gift for my mom?",
    "how far is the moon?",
    "recommend me a movie",
    "what's the population of Brazil?",
    "how do I get rid of hiccups?",
    "can dogs eat grapes?",
    "what's trending on twitter?",
    "how do airplanes fly?",
    "what's your favourite color?",
    "where should I go on vacation?",
    "how many calories in an apple?",
)
AWAY = (
    "brb",
    "one sec",
    "let me check with my boss",
    "give me a minute",
    "afk, back soon",
    "hold on, someone's at the door",
    "I'll read it later",
    "let me think about it",
    "will get back to you",
    "checking now",
    "hang on",
    "let me try it first",
    "be right back",
    "gotta run, talk later",
    "I'll test it tomorrow",
    "one moment",
    "let me run it and see",
    "need to ask my teammate",
    "sec",
    "ok let me look",
    "will check later today",
    "my battery is dying, brb",
)
ASIDES = (
    "by the way, my name is {name}",
    "fyi I'm on Windows",
    "the repo is private, so keep it to yourself",
    "just so you know, this is for a school project",
    "I'm in the Berlin timezone btw",
    "for context, the deadline is next week",
    "note: we use Python 3.12 here",
    "also, my manager will read this",
    "my email is {name}@example.com if you need it",
    "btw I'm using a Mac",
    "context: the team is five people",
    "we deploy on Fridays, fyi",
    "I'm left handed, if that matters",
    "we're a small startup",
    "our office is in Lisbon",
    "I'm a nurse by the way",
    "the client is in Japan",
    "it's my first week on this project",
    "we use GitLab, not GitHub",
    "I'm studying for finals",
    "my cat is called Miso lol",
    "this laptop is ancient btw",
)
ASIDE_FRAMES = (
    "{a}",
    "unrelated question: {q}",
    "random question - {q}",
    "off topic but {q}",
    "{a}. anyway, {q}",
    "quick q unrelated to this: {q}",
    "changing the subject: {q}",
    "{a}",
)
NONCOMMITTAL = (
    "hm",
    "i see",
    "ok?",
    "interesting",
    "huh",
    "hmm",
    "oh",
    "right",
    "...",
    "so?",
    "hmm ok",
    "uh",
    "well",
    "maybe",
    "we'll see",
    "k",
)

OPENERS = ("", "", "", "hey, ", "ok so ", "well ", "hmm ", "lol ", "oh ", "haha ")
EMOJIS = ("", "", "", " 👍", " 🙂", " 🙏", " 😅", " 😩", " 🔥", " :)")

# ----------------------------------------------------------------------------- program outputs
# Each entry is a generator ``rng -> output``; slot values are drawn fresh every time.

_FILES = (
    "app.py",
    "main.go",
    "index.ts",
    "README.md",
    "setup.cfg",
    "utils.py",
    "server.js",
    "config.yaml",
    "Makefile",
    "data.csv",
    "notes.txt",
    "lib.rs",
    "schema.sql",
    "test_app.py",
)
_DIRS = ("src", "lib", "tests", "docs", "scripts", "build", "assets", "pkg", "app", "tools")
_PKGS = (
    "requests",
    "numpy",
    "flask",
    "pandas",
    "express",
    "lodash",
    "rich",
    "httpx",
    "pytest",
    "django",
    "react",
    "axios",
    "serde",
    "tokio",
    "click",
    "pyyaml",
)
_CMDS = (
    "pytset",
    "pyhton",
    "gti",
    "npmm",
    "mkae",
    "dokcer",
    "kubctl",
    "pip3.15",
    "node18",
    "cargoo",
    "lss",
    "grpe",
)
_ERRORS = (
    ("ModuleNotFoundError", "No module named '{pkg}'"),
    ("KeyError", "'{word}'"),
    ("TypeError", "unsupported operand type(s) for +: 'int' and 'str'"),
    ("ValueError", "invalid literal for int() with base 10: '{word}'"),
    ("AttributeError", "'NoneType' object has no attribute '{word}'"),
    ("ZeroDivisionError", "division by zero"),
    ("FileNotFoundError", "[Errno 2] No such file or directory: '{file}'"),
    ("IndexError", "list index out of range"),
    ("NameError", "name '{word}' is not defined"),
    ("ImportError", "cannot import name '{word}' from '{pkg}'"),
    ("RuntimeError", "maximum recursion depth exceeded"),
    ("json.decoder.JSONDecodeError", "Expecting value: line 1 column 1 (char 0)"),
)
_WORDS = (
    "user_id",
    "total",
    "config",
    "items",
    "name",
    "session",
    "price",
    "token",
    "count",
    "path",
    "result",
    "client",
)
_NAMES = ("Ada", "Linus", "Grace", "Alan", "Margaret", "Dennis", "Barbara", "Ken")


def _n(rng: random.Random, lo: int = 1, hi: int = 99) -> int:
    return rng.randint(lo, hi)


def _f(rng: random.Random) -> str:
    return rng.choice(_FILES)


def _p(rng: random.Random) -> str:
    return f"{rng.choice(_DIRS)}/{_f(rng)}"


def _ls(rng: random.Random) -> str:
    rows = [
        f"-rw-r--r--  1 dev dev {_n(rng, 100, 9999):>5} Mar {_n(rng, 1, 28):>2} 10:{_n(rng, 10, 59)} {f}"
        for f in rng.sample(_FILES, rng.randint(2, 6))
    ]
    return f"total {_n(rng, 8, 96)}\n" + "\n".join(rows)


def _pip_ok(rng: random.Random) -> str:
    pkgs = rng.sample(_PKGS, rng.randint(1, 3))
    return "Successfully installed " + " ".join(
        f"{p}-{_n(rng, 0, 9)}.{_n(rng, 0, 30)}.{_n(rng, 0, 9)}" for p in pkgs
    )


def _git_ok(rng: random.Random) -> str:
    h = "".join(rng.choice("0123456789abcdef") for _ in range(7))
    return (
        f"[{rng.choice(('main', 'dev', 'fix-login'))} {h}] {rng.choice(('Fix parser', 'Add tests', 'Update docs', 'Refactor client'))}\n"
        f" {_n(rng, 1, 9)} files changed, {_n(rng)} insertions(+), {_n(rng)} deletions(-)"
    )


def _grep_ok(rng: random.Random) -> str:
    word = rng.choice(_WORDS)
    return "\n".join(
        f"{_p(rng)}:{_n(rng, 1, 400)}:    {word} = {rng.choice(('None', '0', 'load()', '[]'))}"
        for _ in range(rng.randint(1, 4))
    )


def _json_ok(rng: random.Random) -> str:
    items = [{"id": _n(rng, 1, 999), "name": rng.choice(_NAMES)} for _ in range(rng.randint(1, 3))]
    return json.dumps({rng.choice(("users", "items", "results", "data")): items})


def _server_ok(rng: random.Random) -> str:
    return rng.choice(
        (
            "Server running at http://localhost:{p}/",
            "Listening on port {p}",
            "  VITE ready in {t} ms\n  ➜  Local:   http://localhost:{p}/",
            "Uvicorn running on http://127.0.0.1:{p} (Press CTRL+C to quit)",
        )
    ).format(p=rng.choice((3000, 5173, 8000, 8080)), t=_n(rng, 100, 900))


def _build_ok(rng: random.Random) -> str:
    return rng.choice(
        (
            "Build succeeded in {t}s",
            "Compiled successfully in {t}s.",
            "    Finished release [optimized] target(s) in {t}s",
            "BUILD SUCCESSFUL in {t}s",
            "webpack compiled successfully in {t} ms",
            "added {n} packages, and audited {n} packages in {t}s\n\nfound 0 vulnerabilities",
        )
    ).format(t=_n(rng, 1, 60), n=_n(rng, 5, 400))


def _write_ok(rng: random.Random) -> str:
    return rng.choice(
        (
            "Wrote {n} lines to {f}",
            "Created {f}",
            "Saved {f} ({n} bytes)",
            "Copied {n} files to backup/",
            "Renamed {f} -> {g}",
            "Updated {n} rows",
        )
    ).format(n=_n(rng, 1, 500), f=_p(rng), g=_p(rng))


def _cat_ok(rng: random.Random) -> str:
    w = rng.choice(_WORDS)
    return rng.choice(
        (
            f"def {w}():\n    return {_n(rng)}\n",
            f"# {rng.choice(('Parser', 'Billing', 'Notes'))}\n\nThis project handles {w}.\n",
            f"{w}: {_n(rng)}\nname: {rng.choice(_NAMES)}\n",
            f"id,{w},amount\n1,{rng.choice(_NAMES)},{_n(rng)}\n2,{rng.choice(_NAMES)},{_n(rng)}",
        )
    )


def _sql_ok(rng: random.Random) -> str:
    rows = [f" {i} | {rng.choice(_NAMES):<8} | {_n(rng)}" for i in range(1, rng.randint(2, 5))]
    return "id | name     | qty\n---+----------+----\n" + "\n".join(rows) + f"\n({len(rows)} rows)"


def _misc_ok(rng: random.Random) -> str:
    return rng.choice(
        (
            "Python 3.{a}.{b}",
            "v20.{a}.{b}",
            "HTTP/1.1 200 OK\ncontent-type: application/json",
            "Found {n} results for '{w}'",
            "Deployment complete: https://{w}.example.com",
            "{n} files reformatted, {a} files left unchanged",
            "Migrated database to version {a}",
            "Hello, world!",
            "{n}",
            "OK",
            "Filesystem Size Used Avail Use%\n/dev/sda1 50G {a}G 27G {n}%",
        )
    ).format(a=_n(rng, 1, 12), b=_n(rng, 0, 9), n=_n(rng), w=rng.choice(_WORDS))


def _traceback(rng: random.Random) -> str:
    name, msg = rng.choice(_ERRORS)
    msg = msg.format(pkg=rng.choice(_PKGS), word=rng.choice(_WORDS), file=_p(rng))
    return (
        f'Traceback (most recent call last):\n  File "{_p(rng)}", line {_n(rng, 1, 300)}, in '
        f"{rng.choice(_WORDS)}\n    {rng.choice(_WORDS)}()\n{name}: {msg}"
    )


def _shell_err(rng: random.Random) -> str:
    return rng.choice(
        (
            "bash: {c}: command not found",
            "zsh: command not found: {c}",
            "ls: cannot access '{p}': No such file or directory",
            "cat: {p}: No such file or directory",
            "mv: cannot stat '{f}': No such file or directory",
            "{p}: Permission denied",
            "cp: cannot create regular file '{p}': Permission denied",
            "rm: cannot remove '{p}': Is a directory",
            "sh: 1: {c}: not found",
        )
    ).format(c=rng.choice(_CMDS), p=_p(rng), f=_f(rng))


def _git_err(rng: random.Random) -> str:
    return rng.choice(
        (
            "fatal: not a git repository (or any of the parent directories): .git",
            "error: failed to push some refs to 'origin'",
            "CONFLICT (content): Merge conflict in {p}\nAutomatic merge failed; fix conflicts and then commit the result.",
            "error: pathspec '{f}' did not match any file(s) known to git",
            "fatal: remote origin already exists.",
        )
    ).format(p=_p(rng), f=_f(rng))


def _syntax_err(rng: random.Random) -> str:
    return rng.choice(
        (
            '  File "{p}", line {n}\n    print("hi"\n         ^\nSyntaxError: \'(\' was never closed',
            "{p}:{n}:5: error: expected ';' before '}}' token",
            "error[E0308]: mismatched types\n --> {p}:{n}:9",
            "{p}({n},12): error TS2322: Type 'string' is not assignable to type 'number'.",
            "IndentationError: unexpected indent",
        )
    ).format(p=_p(rng), n=_n(rng, 1, 200))


def _pkg_err(rng: random.Random) -> str:
    return rng.choice(
        (
            "npm ERR! missing script: {w}",
            "npm ERR! code E404\nnpm ERR! 404 Not Found - GET https://registry.npmjs.org/{k}x",
            "ERROR: Could not find a version that satisfies the requirement {k}==99.0",
            "E: Unable to locate package {k}x",
            "Error: Cannot find module '{k}'",
            "error: could not compile `{k}` due to 2 previous errors",
        )
    ).format(w=rng.choice(("dev", "start", "build")), k=rng.choice(_PKGS))


def _http_err(rng: random.Random) -> str:
    code, text = rng.choice(
        (
            (404, "Not Found"),
            (500, "Internal Server Error"),
            (401, "Unauthorized"),
            (403, "Forbidden"),
            (400, "Bad Request"),
            (503, "Service Unavailable"),
        )
    )
    return rng.choice(
        (
            f"HTTP/1.1 {code} {text}",
            json.dumps({"error": {"code": code, "message": text}}),
            f"curl: (22) The requested URL returned error: {code}",
        )
    )


def _misc_err(rng: random.Random) -> str:
    return rng.choice(
        (
            "make: *** No rule to make target '{w}'.  Stop.",
            'ERROR:  relation "{w}" does not exist',
            "Segmentation fault (core dumped)",
            "command exited with code {n}",
            "Timeout: the request took longer than {n}s",
            "Connection refused",
            "error: {w} is required",
            "Killed",
            'Exception in thread "main" java.lang.NullPointerException',
            "panic: runtime error: index out of range [{n}] with length {n}",
            'ERROR: database "{w}" does not exist',
            "OSError: [Errno 28] No space left on device",
        )
    ).format(w=rng.choice(_WORDS), n=_n(rng, 1, 130))


def _tests_pass(rng: random.Random) -> str:
    n = _n(rng, 2, 300)
    return rng.choice(
        (
            "============ {n} passed in {t}s ============",
            "Ran {n} tests in 0.{t}s\n\nOK",
            "Tests: {n} passed, {n} total\nTime: {t} s",
            "ok  \tgithub.com/acme/{w}\t0.0{t}s",
            "test result: ok. {n} passed; 0 failed; 0 ignored",
            "{dots}\n{n} passed",
            "All {n} checks passed.",
            "PASS src/{w}.test.js ({n} tests)",
            "{n} examples, 0 failures",
        )
    ).format(n=n, t=_n(rng, 1, 9), w=rng.choice(_WORDS), dots="." * min(n, 40))


def _tests_fail(rng: random.Random) -> str:
    n, k = _n(rng, 2, 300), _n(rng, 1, 9)
    return rng.choice(
        (
            "FAILED tests/test_{w}.py::test_{w} - AssertionError: assert {k} == {n}\n{k} failed, {n} passed in 0.{k}s",
            "Ran {n} tests in 0.02s\n\nFAILED (failures={k})",
            "Tests: {k} failed, {n} passed, {n} total",
            "--- FAIL: Test{W} (0.00s)\n    {w}_test.go:14: got {k}, want {n}\nFAIL",
            "test result: FAILED. {n} passed; {k} failed",
            "F....F....\n{k} failed, {n} passed",
            "ERROR collecting tests/test_{w}.py\nImportError: cannot import name '{W}'",
            "FAIL src/{w}.test.js\n  ● renders {w}\n    expect(received).toBe(expected)",
            "{n} examples, {k} failures",
        )
    ).format(n=n, k=k, w=rng.choice(_WORDS), W=rng.choice(_WORDS).title())


def _empty(rng: random.Random) -> str:
    return rng.choice(
        (
            "",
            "",
            "(no output)",
            "[]",
            "{}",
            "No matches found.",
            "(0 rows)",
            "null",
            "0 results",
            "No {w} match your search.",
            "nothing to show",
            "  ",
            "\n",
            json.dumps({rng.choice(_WORDS): []}),
            "Found 0 results for '{w}'",
            "(empty)",
            "None",
        )
    ).replace("{w}", rng.choice(_WORDS))


def _empty_ok(rng: random.Random) -> str:
    return rng.choice(
        (
            "(exit code 0)",
            "exit code 0, no output",
            "Command completed successfully with no output.",
            "[process exited with status 0]",
            "exit status: 0",
            "(no output, exit code 0)",
            "Done. (exit 0)",
            "✓ exit 0",
        )
    )


def _created_ok(rng: random.Random) -> str:
    return rng.choice(
        (
            "Created issue #{n}: '{W} fails on empty input' (https://tracker.example.com/{n})",
            "Opened pull request #{n}: {W} cleanup",
            "Created branch fix-{w}",
            "Scheduled job {w}-{n} for 09:00",
            "Message sent to #{w} ({n} members)",
            "Uploaded {f} ({n} KB)",
            "Added {name} to the team",
            "Event '{W} review' added to your calendar on Friday",
        )
    ).format(
        n=_n(rng, 2, 999),
        w=rng.choice(_WORDS),
        W=rng.choice(_WORDS).title(),
        f=_f(rng),
        name=rng.choice(_NAMES),
    )


def _per_test_pass(rng: random.Random) -> str:
    w = rng.choice(_WORDS)
    return "\n".join(
        f"tests/test_{w}.py::test_{w}_{i} PASSED" for i in range(rng.randint(2, 5))
    ) + rng.choice(("", f"\n\n{_n(rng, 2, 40)} passed"))


def _per_test_fail(rng: random.Random) -> str:
    w = rng.choice(_WORDS)
    lines = [f"tests/test_{w}.py::test_{w}_{i} PASSED" for i in range(rng.randint(1, 3))]
    lines.insert(rng.randrange(len(lines) + 1), f"tests/test_{w}.py::test_{w}_edge FAILED")
    return "\n".join(lines)


def _verifier_pass(rng: random.Random) -> str:
    return rng.choice(
        (
            "verifier: all {n} checks passed (reward 1.0)",
            "Result check: output matches the expected table ({n} rows). PASS",
            "task complete: {n}/{n} hidden tests passed",
            "grader: correct (score 1.0)",
            "PASS: the file contains the expected text",
            "reward: 1.0 (solved)",
        )
    ).format(n=_n(rng, 2, 40))


def _verifier_fail(rng: random.Random) -> str:
    k = _n(rng, 2, 40)
    return rng.choice(
        (
            "verifier: {j} of {k} hidden tests passed (reward 0.0)",
            "Result check: output does not match the expected table. FAIL",
            "task incomplete: expected file {f} not found",
            "grader: wrong answer (score 0.0)",
            "FAIL: expected '{w}' in {f}",
            "reward: 0.0 (not solved)",
        )
    ).format(k=k, j=_n(rng, 0, k - 1), f=_f(rng), w=rng.choice(_WORDS))


ToolGen = Callable[[random.Random], str]
TOOL_SUCCESS: tuple[ToolGen, ...] = (
    _created_ok,
    _ls,
    _pip_ok,
    _git_ok,
    _grep_ok,
    _json_ok,
    _server_ok,
    _build_ok,
    _write_ok,
    _cat_ok,
    _sql_ok,
    _misc_ok,
)
TOOL_ERROR: tuple[ToolGen, ...] = (
    _traceback,
    _shell_err,
    _git_err,
    _syntax_err,
    _pkg_err,
    _http_err,
    _misc_err,
)


# ----------------------------------------------------------------------------- assembly


def _pool(items: Sequence[T], split: Split) -> Sequence[T]:
    if split == "all":
        return items
    return items[0::2] if split == "train" else items[1::2]


def _noise(rng: random.Random, text: str) -> str:
    """People's spelling: case, punctuation, an emoji, the odd typo."""
    r = rng.random()
    if r < 0.35:
        text = text.lower()
    elif r < 0.45:
        text = text[:1].upper() + text[1:]
    if rng.random() < 0.25:
        text = text.rstrip(".!?")
    if rng.random() < 0.08 and len(text) > 6:
        i = rng.randrange(1, len(text) - 2)
        text = text[:i] + text[i + 1] + text[i] + text[i + 2 :]  # a swapped pair
    if rng.random() < 0.15:
        text = text.replace("'", "")  # dont, thats, im
    if rng.random() < 0.05:
        vowels = [i for i, ch in enumerate(text) if ch in "aeiou"]
        if vowels:
            i = rng.choice(vowels)
            text = text[:i] + text[i] * 3 + text[i + 1 :]  # sooo
    return rng.choice(OPENERS) + text + rng.choice(EMOJIS)


def _chat_case(
    rng: random.Random,
    category: CaseCategory,
    reply: str,
    score: Score,
    hint: str | None = None,
) -> JudgeCase:
    request, answer = rng.choice(CHAT_CONTEXTS)
    inp = JudgeInput(
        context=JudgeContext(system=_ASSISTANT_SYSTEM, user=request),
        output=TurnOutput(content=answer),
        next_state=NextStateText(role=NextStateRole.USER, text=reply),
    )
    return JudgeCase(
        id="", category=category, input=inp, expected_score=score, has_hint=hint is not None,
        reference_hint=hint,
    )  # fmt: skip


def _tool_case(
    rng: random.Random,
    category: CaseCategory,
    output: str,
    score: Score,
    role: NextStateRole = NextStateRole.TOOL,
) -> JudgeCase:
    request, tool, arg = rng.choice(AGENT_CONTEXTS)
    key = "command" if tool == "bash" else "query" if tool in ("sql", "search_tickets") else "path"
    inp = JudgeInput(
        context=JudgeContext(system=_AGENT_SYSTEM, user=request),
        output=TurnOutput(content="", tool_calls=[{"name": tool, "arguments": {key: arg}}]),  # type: ignore[list-item]
        next_state=NextStateText(role=role, text=output),
    )
    return JudgeCase(id="", category=category, input=inp, expected_score=score, has_hint=False)


def _makers(split: Split) -> dict[str, tuple[float, Callable[[random.Random], JudgeCase]]]:
    """name -> (weight, maker): one maker per kind of next state."""
    praise, accept, new = _pool(PRAISE, split), _pool(ACCEPT, split), _pool(NEW_REQUESTS, split)
    directives, frames = _pool(DIRECTIVES, split), _pool(DIRECTIVE_FRAMES, split)
    redo, complaints = _pool(REDO, split), _pool(COMPLAINTS, split)
    off, away, nc = _pool(OFF_TOPIC, split), _pool(AWAY, split), _pool(NONCOMMITTAL, split)
    asides, aside_frames = _pool(ASIDES, split), _pool(ASIDE_FRAMES, split)
    sarcasm, future = _pool(SARCASM, split), _pool(FUTURE_FRAMES, split)
    ok, err = _pool(TOOL_SUCCESS, split), _pool(TOOL_ERROR, split)
    P, N, Z = Score.GOOD, Score.BAD, Score.NEUTRAL
    C = CaseCategory

    def _aside(rng: random.Random) -> str:
        frame = rng.choice(aside_frames)
        a = rng.choice(asides).format(name=rng.choice(_NAMES).lower())
        return frame.format(a=a, q=rng.choice(off))

    def _future(rng: random.Random) -> JudgeCase:
        """Praise of this answer with advice for later turns: +1, with a hint."""
        said, hint = rng.choice(directives)
        text = rng.choice(future).format(d=said)
        return _chat_case(rng, C.PRAISE, _noise(rng, text), P, hint)

    def directive(rng: random.Random, lead: str = "") -> JudgeCase:
        said, hint = rng.choice(directives)
        text = rng.choice(frames).format(d=said)
        return _chat_case(rng, C.CORRECTION, _noise(rng, lead + text), N, hint)

    return {
        "praise": (3.0, lambda r: _chat_case(r, C.PRAISE, _noise(r, r.choice(praise)), P)),
        "praise+new": (
            3.0,
            lambda r: _chat_case(
                r,
                C.PRAISE,
                _noise(r, r.choice([*praise, *accept]) + r.choice(CONNECTORS) + r.choice(new)),
                P,
            ),
        ),
        "correction": (3.0, directive),
        "praise+future": (0.7, lambda r: _future(r)),
        "aside": (1.2, lambda r: _chat_case(r, C.NEUTRAL, _noise(r, _aside(r)), Z)),
        "sarcasm": (0.6, lambda r: _chat_case(r, C.COMPLAINT, _noise(r, r.choice(sarcasm)), N)),
        "per_test_pass": (0.4, lambda r: _tool_case(r, C.TEST_PASS, _per_test_pass(r), P)),
        "per_test_fail": (0.4, lambda r: _tool_case(r, C.TEST_FAIL, _per_test_fail(r), N)),
        "verifier_pass": (
            0.5,
            lambda r: _tool_case(r, C.TEST_PASS, _verifier_pass(r), P, NextStateRole.ENVIRONMENT),
        ),
        "verifier_fail": (
            0.5,
            lambda r: _tool_case(r, C.TEST_FAIL, _verifier_fail(r), N, NextStateRole.ENVIRONMENT),
        ),
        "thanks+correction": (1.5, lambda r: directive(r, r.choice(praise).rstrip("!.") + ". ")),
        "redo": (1.5, lambda r: _chat_case(r, C.REDO, _noise(r, r.choice(redo)), N)),
        "complaint": (
            3.0,
            lambda r: _chat_case(r, C.COMPLAINT, _noise(r, r.choice(complaints)), N),
        ),
        "off_topic": (1.5, lambda r: _chat_case(r, C.NEUTRAL, _noise(r, r.choice(off)), Z)),
        "away": (1.0, lambda r: _chat_case(r, C.NEUTRAL, _noise(r, r.choice(away)), Z)),
        "noncommittal": (0.5, lambda r: _chat_case(r, C.NEUTRAL, r.choice(nc), Z)),
        "tool_success": (2.0, lambda r: _tool_case(r, C.TOOL_SUCCESS, r.choice(ok)(r), P)),
        "tool_error": (2.0, lambda r: _tool_case(r, C.TOOL_ERROR, r.choice(err)(r), N)),
        "test_pass": (1.0, lambda r: _tool_case(r, C.TEST_PASS, _tests_pass(r), P)),
        "test_fail": (1.0, lambda r: _tool_case(r, C.TEST_FAIL, _tests_fail(r), N)),
        "tool_empty": (1.0, lambda r: _tool_case(r, C.TOOL_EMPTY, _empty(r), Z)),
        "tool_empty_ok": (0.5, lambda r: _tool_case(r, C.TOOL_EMPTY, _empty_ok(r), P)),
    }


def synthetic_cases(n: int, *, split: Split = "train", seed: int = 0) -> list[JudgeCase]:
    """``n`` labeled cases drawn from the ``split`` phrase pools (deduplicated by next state).

    Args:
        n: how many cases (fewer when the pools run out of distinct next states).
        split: ``train`` (even pool entries), ``val`` (odd entries: phrasing unseen in train) or
            ``all``.
        seed: the draw.

    Returns:
        Cases with ids ``synthetic-<split>-<kind>-<n>``.
    """
    rng = random.Random(f"{seed}:{split}")
    makers = _makers(split)
    names = list(makers)
    weights = [makers[k][0] for k in names]
    out: list[JudgeCase] = []
    seen: set[tuple[str, str]] = set()
    tries = 0
    while len(out) < n and tries < 20 * n:
        tries += 1
        kind = rng.choices(names, weights)[0]
        case = makers[kind][1](rng)
        key = (case.input.next_state.role.value, case.input.next_state.text)
        if key in seen and case.input.next_state.role == NextStateRole.USER:
            continue
        seen.add(key)
        out.append(case.model_copy(update={"id": f"synthetic-{split}-{kind}-{len(out):05d}"}))
    return out


def write_jsonl(cases: Sequence[JudgeCase], path: str) -> None:
    """Write cases in the labeled-set format :func:`clawrl.judge.cases.load_cases` reads."""
    with open(path, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c.model_dump(mode="json", exclude_none=True)) + "\n")
