"""Regenerate the template-built sample tasks (retrieval, classification) in this folder.

The sample tasks demonstrate ``kvembed eval``; they are no benchmark. Every text here was written
for kvembed (no third-party data), so the files are under the project's licence. The STS pairs
(``sample-sts.tsv``) are hand-written; the two tasks below are generated deterministically from
the templates in this file, so ``python src/kvembed/data/tasks/build_samples.py`` reproduces them
byte for byte.

- ``sample-retrieval/``: 60 fictional towns x 5 facets (climate, trade, food, history, festival)
  = 300 passages; one query per town asks about one facet in other words than its passage, so a
  hit needs both the town and the facet (the other 4 passages of the town and the 59 passages of
  the same facet are the distractors).
- ``sample-classification.jsonl``: 4 topics x 30 short texts (20 train, 10 test).
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

PREFIXES = ["Ash", "Bel", "Cor", "Dun", "Elm", "Fen", "Gal", "Har", "Ister", "Kel", "Lom", "Mar"]
SUFFIXES = ["ford", "wick", "haven", "moor", "stead"]
TOWNS = [p + s for s in SUFFIXES for p in PREFIXES]  # 60 names

FACETS: dict[str, dict[str, list[str]]] = {
    "climate": {
        "values": [
            "long, snowy winters and short, cool summers", "mild, wet winters and warm, dry summers",
            "fierce autumn gales from the sea", "thick morning fog for much of the year",
            "hot summers with frequent thunderstorms", "a dry wind that blows down from the hills",
            "steady drizzle in every season", "bright, cold winters with little snow",
            "humid summers and sudden spring floods", "frosts that arrive early in October",
            "clear skies and the lowest rainfall in the province", "heavy snowfall that cuts the roads each January",
        ],
        "passages": [
            "The weather in {town} is known for {value}.",
            "Visitors to {town} should expect {value}.",
            "{town} lies in a valley that brings it {value}.",
        ],
        "queries": [
            "What is the weather like in {town}?", "How is the climate of {town}?",
            "What kind of seasons does {town} have?",
        ],
    },
    "trade": {
        "values": [
            "wool and woven blankets", "copper mined in the nearby hills", "apples and pressed cider",
            "timber floated down the river", "salt dried in shallow pans", "glass blown in family workshops",
            "clocks and small brass instruments", "cheese aged in limestone caves", "paper made from flax",
            "pottery glazed in deep blue", "boats built from oak", "honey and beeswax candles",
        ],
        "passages": [
            "Most families in {town} earn their living from {value}.",
            "The economy of {town} has long depended on {value}.",
            "Merchants travel to {town} to buy {value}.",
        ],
        "queries": [
            "What do people in {town} do for work?", "Which industry supports {town}?",
            "What does {town} sell to other places?",
        ],
    },
    "food": {
        "values": [
            "smoked trout served with rye bread", "a thick soup of barley and mushrooms",
            "sweet pastries filled with poppy seeds", "lamb slowly roasted with rosemary",
            "pancakes made from buckwheat flour", "a spicy stew of beans and peppers",
            "dumplings stuffed with cabbage", "grilled sardines eaten on the harbour wall",
            "a dark fruit cake baked for weddings", "pickled herring with onions",
            "flatbread cooked on hot stones", "a cold cucumber and yoghurt soup",
        ],
        "passages": [
            "The kitchens of {town} are famous for {value}.",
            "No meal in {town} is complete without {value}.",
            "A traditional dish of {town} is {value}.",
        ],
        "queries": [
            "Which dish should I try in {town}?", "What do locals in {town} like to eat?",
            "What is the typical food of {town}?",
        ],
    },
    "history": {
        "values": [
            "by monks who built a mill beside the stream", "as a river crossing guarded by a wooden fort",
            "by shepherds who wintered their flocks there", "after a fire destroyed the older village upstream",
            "by fishermen sheltering from a storm", "around a market granted by a duke",
            "by miners who followed a seam of copper", "as a resting place on the pilgrims' road",
            "by refugees fleeing a flood in the lowlands", "around a well believed to cure fevers",
            "by a guild of weavers seeking cheap land", "as a toll station on the mountain road",
        ],
        "passages": [
            "{town} was founded {value}.",
            "According to the town records, {town} began {value}.",
            "The first houses of {town} were built {value}.",
        ],
        "queries": [
            "How did {town} begin?", "Who founded {town} and why?", "What is the origin of {town}?",
        ],
    },
    "festival": {
        "values": [
            "a lantern parade on the longest night", "a boat race on the first day of summer",
            "a week of music when the harvest ends", "a horse fair every September",
            "a bonfire on the hill each midwinter", "a cheese rolling contest in May",
            "a masked dance held in the old square", "a kite flying day in early spring",
            "a procession of decorated carts", "a night when every window holds a candle",
            "a swimming race across the cold lake", "a market of spring flowers on the bridge",
        ],
        "passages": [
            "Every year {town} celebrates with {value}.",
            "The highlight of the calendar in {town} is {value}.",
            "Crowds come to {town} for {value}.",
        ],
        "queries": [
            "What celebration is held in {town}?", "Which yearly event draws visitors to {town}?",
            "How does {town} celebrate?",
        ],
    },
}


def retrieval() -> tuple[list[dict[str, str]], list[dict[str, str]], list[tuple[str, str, int]]]:
    """Corpus, queries and qrels: passage facet f of town t uses value (7t + 3f) % 12 and template
    (t + f) % 3; town t's query asks about facet t % 5 with template t % 3."""
    corpus: list[dict[str, str]] = []
    queries: list[dict[str, str]] = []
    qrels: list[tuple[str, str, int]] = []
    for t, town in enumerate(TOWNS):
        for f, (facet, spec) in enumerate(FACETS.items()):
            value = spec["values"][(7 * t + 3 * f) % len(spec["values"])]
            template = spec["passages"][(t + f) % len(spec["passages"])]
            text = template.format(town=town, value=value)
            corpus.append({"id": f"{town.lower()}-{facet}", "title": "", "text": text[0].upper() + text[1:]})
        facet = list(FACETS)[t % len(FACETS)]
        query = FACETS[facet]["queries"][t % len(FACETS[facet]["queries"])]
        queries.append({"id": f"q{t + 1:02d}", "text": query.format(town=town)})
        qrels.append((f"q{t + 1:02d}", f"{town.lower()}-{facet}", 1))
    return corpus, queries, qrels


TOPICS: dict[str, tuple[list[str], list[str]]] = {
    "sport": (
        ["The striker", "Our goalkeeper", "The young sprinter", "The visiting team", "The tennis champion",
         "The cycling club"],
        ["scored twice in the second half", "trained on the track before dawn", "won the match on penalties",
         "broke the national record", "lost the final in straight sets", "climbed the last hill of the race"],
    ),
    "cooking": (
        ["My grandmother", "The chef", "The recipe", "Our neighbour", "The baker", "This cookbook"],
        ["adds a pinch of salt to the dough", "roasts the vegetables with garlic", "lets the sauce simmer for an hour",
         "whisks the eggs until they are fluffy", "serves the soup with fresh bread", "chops the herbs very finely"],
    ),
    "weather": (
        ["The forecast", "This morning", "The storm", "The coastal region", "Tomorrow", "The mountain town"],
        ["brings heavy rain and strong winds", "was cold with a thick frost", "is expected to turn sunny and warm",
         "saw snow falling for hours", "will be cloudy with light showers", "had the hottest afternoon of the year"],
    ),
    "computing": (
        ["The new laptop", "The software update", "Our server", "The programmer", "This database", "The app"],
        ["crashed after the memory filled up", "runs much faster with the new processor", "fixed a bug in the login page",
         "stores every record in encrypted form", "needs a restart to install the patch", "compiles the code in seconds"],
    ),
}


def classification() -> list[dict[str, str]]:
    """30 texts per topic (subject i % 6 with predicate (i + i // 6) % 6, i < 30): the first 20
    train, the last 10 test."""
    rows: list[dict[str, str]] = []
    for label, (subjects, predicates) in TOPICS.items():
        for i in range(30):
            text = f"{subjects[i % 6]} {predicates[(i + i // 6) % 6]}."
            rows.append({"text": text, "label": label, "split": "train" if i < 20 else "test"})
    return rows


def main() -> None:
    corpus, queries, qrels = retrieval()
    folder = HERE / "sample-retrieval"
    folder.mkdir(exist_ok=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in corpus)
    with (folder / "queries.jsonl").open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in queries)
    with (folder / "qrels.tsv").open("w", encoding="utf-8") as handle:
        handle.write("query-id\tcorpus-id\tscore\n")
        handle.writelines(f"{q}\t{d}\t{s}\n" for q, d, s in qrels)
    with (HERE / "sample-classification.jsonl").open("w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in classification())


if __name__ == "__main__":
    main()
