"""Writes the two local lm-eval tasks' JSON Lines (hand-written passages; run once, output committed)."""
import json
from pathlib import Path

PASSAGES = [
    ("The Danube is the second-longest river in Europe. It rises in the Black Forest of Germany and flows "
     "south-east for about 2,850 kilometres through ten countries, including Austria, Hungary, Serbia and "
     "Romania, before emptying into the Black Sea through a wide delta. Four capital cities lie on its banks: "
     "Vienna, Bratislava, Budapest and Belgrade.",
     "The Danube empties into the", ["Black Sea", "North Sea", "Baltic Sea", "Adriatic Sea"], 0),
    ("Marie Curie was born in Warsaw in 1867 and moved to Paris to study physics and mathematics. With her "
     "husband Pierre she discovered two new chemical elements, polonium and radium. She was the first woman "
     "to win a Nobel Prize and remains the only person to have won Nobel Prizes in two different sciences, "
     "physics in 1903 and chemistry in 1911.",
     "Marie Curie was born in the city of", ["Vienna", "Warsaw", "Paris", "Prague"], 1),
    ("Honey bees live in colonies of tens of thousands of workers, a few hundred drones and a single queen. "
     "Workers collect nectar and pollen from flowers and store the nectar as honey in wax cells. A worker "
     "that finds a rich patch of flowers returns to the hive and performs a waggle dance, whose angle and "
     "length tell the other bees the direction and distance of the food.",
     "A colony of honey bees has a single", ["drone", "worker", "queen", "flower"], 2),
    ("The Great Wall of China is a series of fortifications built over many centuries to protect Chinese "
     "states against raids from the northern steppe. The best-known sections were built during the Ming "
     "dynasty, between the fourteenth and seventeenth centuries, mostly of brick and stone. Watchtowers along "
     "the wall used smoke by day and fire by night to send warnings.",
     "The best-known sections of the wall were built during the", ["Tang dynasty", "Han dynasty", "Qing dynasty", "Ming dynasty"], 3),
    ("Photosynthesis is the process by which green plants turn light into chemical energy. In the "
     "chloroplasts of their leaves, the pigment chlorophyll absorbs sunlight, which drives the conversion "
     "of carbon dioxide from the air and water from the soil into glucose. Oxygen is released as a by-product, "
     "and nearly all the oxygen in the atmosphere comes from this process.",
     "The pigment that absorbs sunlight in leaves is called", ["chlorophyll", "glucose", "carbon", "oxygen"], 0),
    ("Mount Kilimanjaro in Tanzania is the highest mountain in Africa, rising to 5,895 metres above sea "
     "level. It is a dormant volcano with three cones: Kibo, Mawenzi and Shira. Climbers pass through "
     "rainforest, heath, alpine desert and finally an arctic summit zone, where glaciers have been shrinking "
     "quickly over the last century.",
     "Mount Kilimanjaro is in the country of", ["Kenya", "Tanzania", "Uganda", "Ethiopia"], 1),
    ("Johannes Gutenberg, a goldsmith from Mainz, introduced printing with movable metal type to Europe around "
     "1450. His press combined a hand mould for casting letters, an oil-based ink and a screw press adapted "
     "from those used for wine. The Gutenberg Bible, printed in about 180 copies, was the first major book "
     "produced this way.",
     "Gutenberg came from the city of", ["Cologne", "Berlin", "Mainz", "Hamburg"], 2),
    ("The human heart has four chambers: two upper atria and two lower ventricles. The right side receives "
     "blood from the body and pumps it to the lungs, where it picks up oxygen. The left side receives the "
     "oxygen-rich blood from the lungs and pumps it out to the rest of the body through the aorta, the "
     "largest artery.",
     "The largest artery of the body is the", ["vein", "ventricle", "atrium", "aorta"], 3),
]

here = Path(__file__).parent
with open(here / "mc.jsonl", "w") as f:
    for passage, stem, choices, answer in PASSAGES:
        f.write(json.dumps({"context": f"{passage}\n\n{stem}", "choices": [" " + c for c in choices], "answer": answer}) + "\n")
with open(here / "gen.jsonl", "w") as f:
    for passage, stem, choices, answer in PASSAGES:
        f.write(json.dumps({"prompt": f"{passage}\n\nComplete the sentence.\n{stem}", "answer": choices[answer]}) + "\n")
