"""Calibration texts for the intrinsic-dimension layer selection.

The built-in set (``kvembed/data/calibration.txt``, one sentence per line) was written for this
project: :func:`generate_calibration` builds it from the templates and vocabulary below (no
dataset was copied), and ``python -c "from kvembed.modeling.layers.calibration import write_builtin;
write_builtin()"`` regenerates the shipped file byte for byte (a test checks that they agree).

The paper used 1,000 sentences from F2LLM; any ~1,000 varied sentences serve the same purpose:
a cloud of final-token states spread over many topics, lengths and sentence types.
"""

from __future__ import annotations

import os
import random
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

from .estimate import MIN_POINTS
from ...errors import InvalidInput

BUILTIN_NAME = "calibration.txt"
BUILTIN_SIZE = 1000
BUILTIN_SEED = 20240917


def builtin_calibration_path() -> Path:
    """The shipped calibration file (``kvembed/data/calibration.txt``)."""
    return Path(str(resources.files("kvembed") / "data" / BUILTIN_NAME))


def load_calibration(
    calibration: Sequence[str] | str | os.PathLike[str] | None = None,
    num_texts: int = BUILTIN_SIZE,
) -> list[str]:
    """The first ``num_texts`` distinct non-empty texts of ``calibration``.

    ``calibration`` is a list of texts, a path to a UTF-8 file with one text per line, or
    ``None`` for the built-in set. Lines are stripped; empty lines and exact repeats are dropped
    (a repeated text would be a duplicate point for TwoNN). Raises ``FileNotFoundError`` for a
    missing file and ``ValueError`` when fewer than :data:`MIN_POINTS` texts remain.
    """
    if isinstance(num_texts, bool) or int(num_texts) != num_texts or num_texts < MIN_POINTS:
        raise InvalidInput(f"num_texts must be an integer >= {MIN_POINTS} (TwoNN needs that many points), got {num_texts!r}")
    if calibration is None or isinstance(calibration, (str, os.PathLike)):
        path = builtin_calibration_path() if calibration is None else Path(calibration).expanduser()
        source = "the built-in calibration set" if calibration is None else str(path)
        if not path.is_file():
            raise FileNotFoundError(f"calibration file not found: {path}")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise InvalidInput(f"calibration file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    else:
        lines = list(calibration)
        source = "the calibration texts"
        for index, item in enumerate(lines):
            if not isinstance(item, str):
                raise TypeError(f"calibration[{index}] is {type(item).__name__}, expected str")
    texts = list(dict.fromkeys(line.strip() for line in lines if line.strip()))
    if len(texts) < MIN_POINTS:
        raise InvalidInput(
            f"{source} has {len(texts)} distinct non-empty text(s); TwoNN needs at least {MIN_POINTS} "
            "(the paper used 1,000)"
        )
    return texts[: int(num_texts)]


# ----- the generator of the built-in set ----------------------------------------------------

NAMES = (
    "Maya", "Tom", "Priya", "Oskar", "Lena", "Samir", "Grace", "Diego", "Hannah", "Kenji", "Amara",
    "Felix", "Ines", "Jonah", "Leila", "Marcus", "Nadia", "Pablo", "Rosa", "Theo", "Yusuf", "Zoe",
)
PEOPLE = (
    "my neighbour", "the new teacher", "a retired engineer", "our youngest daughter", "the bus driver",
    "a nurse from the night shift", "the museum guide", "an old fisherman", "the head chef",
    "a young architect", "my grandmother", "the school librarian", "a delivery cyclist",
    "the village baker", "a visiting professor", "the team captain", "a shy student", "the mayor",
)
PLACES = (
    "the old library", "the train station", "the farmers' market", "the hospital garden",
    "a small café near the river", "the town square", "the science museum", "the ferry terminal",
    "the community pool", "a quiet bookshop", "the hardware store", "the mountain hut",
    "the night market", "the football pitch", "the city archive", "the harbour wall",
)
CITIES = (
    "Lisbon", "Nairobi", "Osaka", "Toronto", "Krakow", "Lima", "Dublin", "Hanoi", "Oslo", "Accra",
    "Seville", "Melbourne", "Tbilisi", "Quito", "Glasgow", "Busan", "Porto", "Cape Town",
)
TIMES = (
    "last Tuesday", "early this morning", "after lunch", "during the storm", "on Sunday evening",
    "before sunrise", "late at night", "in the middle of winter", "every other weekend",
    "at the end of the summer", "yesterday afternoon", "two years ago",
)
ACTIONS = (
    "fixed a broken bicycle", "painted a mural", "lost a set of keys", "found a stray kitten",
    "read an entire novel", "planted three apple trees", "baked bread for everyone",
    "gave a short speech", "repaired the leaking roof", "taught a chess lesson",
    "sold old records", "waited for the delayed train", "organised a clean-up",
    "played the violin", "recorded bird songs", "sketched the skyline",
)
PHENOMENA = (
    "ice float on water", "bread go stale so quickly", "the sky turn red at sunset",
    "a cat purr", "metal feel colder than wood", "the moon change shape", "onions make us cry",
    "hot air rise", "a compass point north", "leaves change colour in autumn",
    "thunder follow lightning", "coffee keep people awake", "salt melt ice on roads",
    "a bicycle stay upright while moving", "the sea taste salty", "yawning spread between people",
)
TASKS = (
    "reset my router", "remove a coffee stain from a shirt", "start a vegetable garden",
    "write a cover letter", "back up photos from my phone", "learn to swim as an adult",
    "bleed a radiator", "make sourdough starter", "train a puppy to sit", "change a flat tyre",
    "split a bill fairly among friends", "improve my handwriting", "fall asleep faster",
    "prepare for a job interview", "keep basil alive indoors", "clean a cast iron pan",
)
FACTS = (
    "water boils at a lower temperature at high altitude",
    "octopuses have three hearts",
    "light from the Sun takes about eight minutes to reach the Earth",
    "honey can stay edible for a very long time",
    "bamboo is one of the fastest growing plants",
    "the human body replaces its skin cells constantly",
    "sound travels faster in water than in air",
    "some birds use the Earth's magnetic field to navigate",
    "a year on Mars is almost twice as long as a year on Earth",
    "bananas are slightly radioactive because of their potassium",
    "glass is made mostly from sand",
    "whales communicate with sounds that travel for many kilometres",
    "the deepest parts of the ocean are still largely unexplored",
    "trees exchange nutrients through fungal networks in the soil",
    "copper turns green when it reacts with air and water",
    "a teaspoon of soil can hold millions of microorganisms",
)
FACT_FRAMES = (
    "Did you know that {fact}?",
    "Scientists have long known that {fact}.",
    "Our teacher explained that {fact}.",
    "It surprised me to learn that {fact}.",
    "According to the documentary, {fact}.",
)
#: (subject, is plural)
OPINION_SUBJECTS = (
    ("remote work", False), ("public transport", False), ("the new stadium", False),
    ("online classes", True), ("electric scooters", True), ("the local newspaper", False),
    ("modern architecture", False), ("reality television", False), ("four-day work weeks", True),
    ("the city's bike lanes", True), ("school uniforms", True), ("self-checkout machines", True),
    ("open-plan offices", True), ("the night bus", False),
)
#: (singular form, plural form)
OPINION_PREDICATES = (
    ("is overrated", "are overrated"), ("makes life much easier", "make life much easier"),
    ("deserves more funding", "deserve more funding"), ("needs clearer rules", "need clearer rules"),
    ("has improved a lot in recent years", "have improved a lot in recent years"),
    ("is a waste of money", "are a waste of money"), ("brings people together", "bring people together"),
    ("will look very different in ten years", "will look very different in ten years"),
    ("is better than most people admit", "are better than most people admit"),
    ("causes more problems than it solves", "cause more problems than they solve"),
)
WEATHER = ("freezing", "unusually warm", "foggy", "windy", "humid", "pouring with rain", "bright and clear", "snowy")
WEATHER_RESULTS = (
    "the schools closed early", "we stayed inside and played cards", "the ferries were cancelled",
    "everyone went to the beach", "the flight was delayed by two hours", "the streets were empty",
    "the farmers were relieved", "the outdoor concert moved indoors", "we walked instead of driving",
)
FOODS = ("potatoes", "carrots", "lentils", "the onions", "the chicken", "the rice", "the mushrooms", "the tomatoes", "the beans", "the pasta")
COOK_VERBS = ("Simmer", "Roast", "Steam", "Fry", "Boil", "Bake", "Marinate", "Grill")
COOK_NEXT = (
    "adding the spices", "serving them with bread", "stirring in the cream", "seasoning with salt",
    "letting them rest", "mixing them with the herbs", "covering the pot", "draining the water",
)
PRODUCTS = (
    "blender", "pair of hiking boots", "laptop", "desk lamp", "rice cooker", "backpack",
    "phone case", "electric kettle", "office chair", "tent", "vacuum cleaner", "pair of headphones",
)
PRAISE = (
    "works perfectly", "arrived a day early", "is surprisingly light", "feels very sturdy",
    "was easy to set up", "looks great in the kitchen", "is quieter than I expected",
    "has a battery that lasts for days",
)
COMPLAINTS = (
    "the manual is confusing", "it is a little too expensive", "the colour is not what I ordered",
    "the cable is far too short", "it gets hot after an hour", "the buttons feel cheap",
    "the box was damaged", "customer service never replied",
)
POLICIES = (
    "ban cars from the old town", "build a new public library", "plant ten thousand trees",
    "extend the night bus service", "repair the main bridge", "open more public toilets",
    "lower the speed limit near schools", "turn the empty factory into housing",
)
REASONS = (
    "months of public debate", "complaints from local residents", "a report on air quality",
    "a petition signed by thousands", "a series of accidents", "a sharp rise in rents",
    "pressure from small businesses", "a long study by the university",
)
ANIMALS = ("fox", "heron", "squirrel", "tortoise", "owl", "goat", "dolphin", "beetle", "hedgehog", "crow", "seal", "lizard")
ANIMAL_ADJECTIVES = ("curious", "tiny", "old", "hungry", "sleepy", "clever", "muddy", "nervous", "playful", "silent")
ANIMAL_ACTIONS = (
    "crossed the road", "watched us from a branch", "stole a sandwich", "dug a hole",
    "swam close to the boat", "slept in the sun", "followed the hikers", "hid under the porch",
    "drank from the fountain", "chased its own shadow",
)
ANIMAL_WHERE = (
    "near the campsite", "behind the school", "at the edge of the forest", "in our back garden",
    "beside the lake", "on the roof of the shed", "in the middle of the market", "along the coast",
)
FEELINGS = ("proud", "nervous", "relieved", "embarrassed", "grateful", "confused", "delighted", "homesick", "calm", "furious")
EVENTS = (
    "the results were announced", "the lights went out", "an old friend called",
    "the package finally arrived", "the audience started clapping", "the test was postponed",
    "the cake collapsed in the oven", "the bus left without us", "the letter was read aloud",
    "the puppy learned its name",
)
SPORTS = (
    ("The women's hockey team", "scored twice in the final minute"),
    ("Our local club", "came back from three goals down"),
    ("The young sprinter", "broke the regional record"),
    ("The visiting side", "defended for the entire second half"),
    ("The chess champion", "sacrificed her queen on move twenty"),
    ("The rowing crew", "finished a full boat length ahead"),
    ("The veteran goalkeeper", "saved a penalty in extra time"),
    ("The cycling team", "attacked on the final climb"),
)
COMPETITIONS = ("the regional cup", "the national title", "the spring tournament", "the charity match", "the league final", "the school championship")
COMPARISONS = (
    "a train journey is more relaxing than a long drive",
    "fresh bread is much tastier than bread from a packet",
    "a paper map is more reliable than a phone with no signal",
    "learning a language is harder than most people expect",
    "the north side of the island is far windier than the south",
    "a short walk after dinner is better for sleep than scrolling on a phone",
    "this year's harvest is smaller than last year's",
    "the new bridge is twice as wide as the old one",
    "handwritten notes are easier to remember than typed ones",
    "the second book in the series is darker than the first",
    "cycling to work is often quicker than taking the bus",
    "small classes are easier to teach than large ones",
)
COMPARISON_FRAMES = ("{0}.", "Most people agree that {0}.", "My uncle insists that {0}.", "Is it true that {0}?", "I used to think that {0}.")
REQUESTS = (
    "close the window when you leave", "bring your own cup to the meeting",
    "turn off the lights in the lab", "return the books by Friday", "send me the draft tonight",
    "keep the noise down after ten", "water the plants while I am away",
    "sign the form at the bottom", "call the office if you are running late",
    "leave your muddy boots at the door",
)
TECH_THINGS = ("The spreadsheet", "The printer", "My laptop", "The video call", "The shared calendar", "The app", "The website", "The backup script")
TECH_PROBLEMS = (
    "freezes", "crashes", "becomes painfully slow", "logs me out", "shows an error message",
    "loses the last few changes", "refuses to connect", "makes a strange noise",
)
TECH_CONDITIONS = (
    "I open more than two files", "the battery drops below ten percent", "someone joins from abroad",
    "the update runs overnight", "I switch to the guest network", "the room gets too warm",
    "I paste a long table", "two people edit at the same time",
)
VEHICLES = ("night train", "ferry", "coach", "early flight", "shared taxi", "slow local train")
TRAVEL_EXPERIENCES = (
    "watched the landscape change for hours", "met a family travelling to a wedding",
    "arrived just as the shops were closing", "slept most of the way",
    "shared snacks with the people next to us", "missed the connection by a few minutes",
    "saw dolphins from the deck", "talked about books the whole time",
)
INGREDIENTS = ("flour", "sugar", "oats", "milk", "grated cheese", "chopped nuts", "rice", "water")
SPICES = ("salt", "cinnamon", "nutmeg", "black pepper", "chilli flakes", "dried thyme")
HABITS = (
    "drank coffee", "owned a car", "went to the opera", "cooked for more than two people",
    "travelled alone", "spoke in public", "grew tomatoes", "ran a marathon",
)
LIFE_EVENTS = ("moving to the coast", "starting university", "the pandemic", "retiring", "becoming a parent", "the accident")
CONNECTIVES = ("because", "although", "while", "even though", "since")
CLAUSES = (
    "the forecast promised sunshine", "nobody had read the instructions",
    "the museum was closed for repairs", "the price of fuel kept rising",
    "the children were already asleep", "the river had flooded the path",
    "the meeting ran over by an hour", "the power came back on",
    "the last bus had already left", "the garden looked better than ever",
)
MAIN_CLAUSES = (
    "we decided to stay at home", "the kitchen smelled of fresh basil",
    "the streets filled with people", "she kept working on the report",
    "the team celebrated quietly", "he forgot to lock the door",
    "the dog refused to go outside", "the village hall was packed",
)
QUOTES = (
    "I will be there in five minutes.", "Have you seen my umbrella?", "That was the best soup I have ever had.",
    "We should leave before the traffic starts.", "Nobody told me the meeting was cancelled.",
    "Can you help me carry these boxes?", "I think it is going to snow.", "Let's try the other road.",
)
GREETINGS = ("Listen", "Honestly", "Well", "Look", "Hey", "Wait")
SHORT = (
    "Nice work.", "See you tomorrow.", "The kettle is on.", "It is raining again.", "Dinner is ready.",
    "The shop opens at nine.", "I love this song.", "Where are my glasses?", "The meeting starts soon.",
    "Thanks for the flowers.", "That sounds like a plan.", "The train is late.",
)
#: one-off sentences, each used at most once
SINGLES = (
    "The derivative of a constant function is zero everywhere.",
    "If the loop never terminates, check whether the counter is ever incremented.",
    "Interest rates rose for the third quarter in a row, and mortgage applications slowed.",
    "She kept a notebook of every word she did not understand and looked them up on Sundays.",
    "The bridge was closed overnight so engineers could inspect the cables.",
    "A prime number has exactly two divisors: one and itself.",
    "My flight lands at half past six, so don't wait for me for dinner.",
    "The committee postponed its decision until the budget figures are confirmed.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "He apologised for the misunderstanding and offered to pay for the repairs.",
    "Most of the village's houses were built from the grey stone of the nearby quarry.",
    "Can anyone recommend a quiet place to study that stays open after midnight?",
    "The orchestra tuned their instruments while the audience found their seats.",
    "Regular stretching can reduce the risk of injury for older runners.",
    "The function returns an empty list when the input file has no header row.",
    "Our landlord finally agreed to replace the broken boiler before winter.",
    "Volcanic ash can ground flights across an entire continent for days.",
    "The festival ended with fireworks over the harbour and a parade of lanterns.",
    "She argued that the translation lost the humour of the original poem.",
    "Two thirds of the survey respondents said they cycle at least once a week.",
    "The toddler insisted on wearing his rain boots on a perfectly sunny day.",
    "A good password is long, unique and never reused on another website.",
    "The archaeologists found pottery fragments that were older than the city walls.",
    "I'm not sure the restaurant takes reservations, so let's get there early.",
    "The river froze so thickly that people skated from one village to the next.",
    "After the merger, half of the regional offices were closed.",
    "The novel follows three sisters who inherit a failing vineyard.",
    "Measure twice and cut once, my grandfather used to say in his workshop.",
    "The vaccine trial enrolled volunteers from twelve countries.",
    "He spent the afternoon untangling a drawer full of old charging cables.",
    "The satellite sends back images of the polar ice every ninety minutes.",
    "Nobody expected the underdog to reach the semi-finals, least of all the coach.",
    "Wash your hands before handling food and after touching raw meat.",
    "The museum's new wing is devoted entirely to textiles from the coast.",
    "Could the delay be caused by a signalling fault near the tunnel?",
    "Her research shows that sleep helps the brain consolidate new memories.",
    "The startup ran out of money before its product ever reached the shops.",
    "A light breeze carried the smell of cut grass across the playing fields.",
    "Tax returns must be filed by the end of April to avoid a penalty.",
    "The choir rehearsed the same four bars until everyone came in on time.",
    "Salt was once so valuable that it was used to pay soldiers.",
    "We painted the nursery a pale yellow and hung a mobile of paper birds.",
    "The software update fixed the battery drain but introduced a new bug.",
    "Thousands of commuters were stranded when the strike began without warning.",
    "The soup needs more acidity, so add a squeeze of lemon at the end.",
    "A map from the eighteenth century shows a road where the lake is now.",
    "Why do some people remember their dreams while others never do?",
    "The referee's decision was overturned after a video review.",
    "The kids built a fort out of couch cushions and refused to come out.",
    "Rising sea levels threaten many low-lying islands in the Pacific.",
    "The old lighthouse keeper wrote down the weather every evening for forty years.",
    "Please remember to unplug the iron before you leave the house.",
    "Cells divide by copying their DNA and splitting into two identical halves.",
    "The hotel upgraded us to a room with a balcony overlooking the bay.",
    "Critics praised the film's photography but found the plot predictable.",
    "The bakery sells out of croissants by eight o'clock most mornings.",
    "A sudden hailstorm flattened the wheat just days before the harvest.",
    "He learned to code by rewriting small games he had played as a child.",
    "The hospital opened a new ward for children with respiratory illnesses.",
    "Ants leave chemical trails that guide the rest of the colony to food.",
)
YEARS = tuple(range(1952, 2020, 3))
BUSINESSES = ("bakery", "bookshop", "tailor's shop", "bicycle repair shop", "noodle bar", "record store", "pharmacy", "flower stall")
STREETS = ("Mill Lane", "the high street", "Harbour Road", "a narrow side street", "Station Avenue", "the corner by the church")


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _opinion(r: random.Random) -> str:
    subject, plural = r.choice(OPINION_SUBJECTS)
    return f"{subject} {r.choice(OPINION_PREDICATES)[plural]}"


def _a(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _quote(text: str) -> str:
    """A quotation resumed after ``said X,`` continues in lower case (except "I")."""
    return text if text.startswith("I ") else _low(text)


def _low(text: str) -> str:
    return text[:1].lower() + text[1:]


def _templates() -> list[Callable[[random.Random], str]]:
    c = random.Random.choice
    return [
        lambda r: f"{_cap(c(r, PEOPLE))} {c(r, ACTIONS)} at {c(r, PLACES)} {c(r, TIMES)}.",
        lambda r: f"{c(r, NAMES)} {c(r, ACTIONS)} {c(r, TIMES)}.",
        lambda r: f"Why does {c(r, PHENOMENA)}?",
        lambda r: f"How do I {c(r, TASKS)}?",
        lambda r: f"What is the easiest way to {c(r, TASKS)} without spending much money?",
        lambda r: c(r, FACT_FRAMES).format(fact=c(r, FACTS)),
        lambda r: f"{c(r, NAMES)} thinks that {_opinion(r)}.",
        lambda r: f"In my opinion, {_opinion(r)}.",
        lambda r: f"It was {c(r, WEATHER)} in {c(r, CITIES)} {c(r, TIMES)}, so {c(r, WEATHER_RESULTS)}.",
        lambda r: f"{c(r, COOK_VERBS)} {c(r, FOODS)} for {r.randint(5, 45)} minutes before {c(r, COOK_NEXT)}.",
        lambda r: f"The {c(r, PRODUCTS)} {c(r, PRAISE)}, but {c(r, COMPLAINTS)}.",
        lambda r: f"I returned the {c(r, PRODUCTS)} because {c(r, COMPLAINTS)}.",
        lambda r: f"The city council of {c(r, CITIES)} voted to {c(r, POLICIES)} after {c(r, REASONS)}.",
        lambda r: f"{_cap(_a(c(r, ANIMAL_ADJECTIVES)))} {c(r, ANIMALS)} {c(r, ANIMAL_ACTIONS)} {c(r, ANIMAL_WHERE)}.",
        lambda r: f"{c(r, NAMES)} felt {c(r, FEELINGS)} when {c(r, EVENTS)}.",
        lambda r: (lambda s: f"Everyone in {c(r, CITIES)} was talking about how {_low(s[0])} {s[1]}.")(c(r, SPORTS)),
        lambda r: (lambda s: f"{s[0]} {s[1]} to win {c(r, COMPETITIONS)}.")(c(r, SPORTS)),
        lambda r: _cap(c(r, COMPARISON_FRAMES).format(c(r, COMPARISONS))),
        lambda r: f"Please {c(r, REQUESTS)}.",
        lambda r: f"Could you {c(r, REQUESTS)}?",
        lambda r: f"{c(r, TECH_THINGS)} {c(r, TECH_PROBLEMS)} whenever {c(r, TECH_CONDITIONS)}.",
        lambda r: (lambda a, b: f"We took the {c(r, VEHICLES)} from {a} to {b} and {c(r, TRAVEL_EXPERIENCES)}.")(
            *r.sample(CITIES, 2)
        ),
        lambda r: f"The recipe needs {r.randint(2, 6)} cups of {c(r, INGREDIENTS)} and a pinch of {c(r, SPICES)}.",
        lambda r: f"{c(r, NAMES)} never {c(r, HABITS)} before {c(r, LIFE_EVENTS)}.",
        lambda r: f"{_cap(c(r, MAIN_CLAUSES))} {c(r, CONNECTIVES)} {c(r, CLAUSES)}.",
        lambda r: f'"{c(r, GREETINGS)}," said {c(r, NAMES)}, "{_quote(c(r, QUOTES))}"',
        lambda r: f"In {c(r, YEARS)}, a small {c(r, BUSINESSES)} opened on {c(r, STREETS)}, and it is still there today.",
        lambda r: (
            f"After a long week, {c(r, NAMES)} and {c(r, PEOPLE)} went to {c(r, PLACES)} and talked "
            f"until {c(r, ('midnight', 'closing time', 'the rain stopped', 'the candles burned out'))}."
        ),
        lambda r: f"{c(r, NAMES)} asked {c(r, PEOPLE)} whether {_opinion(r)}.",
    ]


def generate_calibration(n: int = BUILTIN_SIZE, seed: int = BUILTIN_SEED) -> list[str]:
    """``n`` distinct sentences: the hand-written ones plus template sentences, shuffled reproducibly."""
    rng = random.Random(seed)
    templates = _templates()
    seen: dict[str, None] = dict.fromkeys((*SINGLES, *SHORT))
    attempts = 0
    while len(seen) < n:
        attempts += 1
        if attempts > 100 * n:
            raise RuntimeError(f"the templates cannot produce {n} distinct sentences")
        seen.setdefault(rng.choice(templates)(rng), None)
    sentences = list(seen)[:n]
    rng.shuffle(sentences)
    return sentences


def write_builtin(path: str | os.PathLike[str] | None = None) -> Path:
    """Write :func:`generate_calibration`'s sentences, one per line (default: the shipped file)."""
    target = builtin_calibration_path() if path is None else Path(path)
    target.write_text("\n".join(generate_calibration()) + "\n", encoding="utf-8")
    return target
