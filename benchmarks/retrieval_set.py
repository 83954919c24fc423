"""A retrieval set for NPC lore: 60 short records of one fantasy world and 40 questions, each
with the record(s) that answer it.

Written for the embedding-model comparison (benchmarks/retrieval_quality.py) and the
embedding benchmark (benchmarks/test_embed.py). The questions are asked the way a player
would ask an NPC: mostly paraphrases that share few words with their record (so word
overlap alone does not find it), a few naming a rare proper noun that only one record
holds (Quillemarch, Ysolde Varrowen, the Thornwake Compact), and some records are near
neighbours of each other (two smiths, two bridges, three potions) so ranking them matters.
"""

# (id, text). Ids are stable: questions refer to them.
RECORDS = [
    # ---- places
    ("place.ashcombe", "Ashcombe is a farming village in the lower vale, known for its "
     "barley fields and the old stone mill on the river Wend."),
    ("place.quillemarch", "Quillemarch is a walled city of scribes built on a hill; its "
     "great library holds maps of every road in the kingdom."),
    ("place.greyfen", "The Greyfen is a cold marsh east of Ashcombe where fog lies all day "
     "and travellers lose the path among the reeds."),
    ("place.ironholt", "Ironholt is a mining town in the northern hills; its deep shafts "
     "yield iron ore and, rarely, veins of silver."),
    ("place.saltmere", "Saltmere is a fishing harbour on the western coast, where the boats "
     "bring in herring and the taverns smell of tar."),
    ("place.hollow_oak", "The Hollow Oak is an ancient tree at the heart of the Elderwood, "
     "wide enough that a shrine was built inside its trunk."),
    ("place.ember_peak", "Ember Peak is a smoking mountain south of Ironholt; the ground near "
     "its summit is warm and nothing grows there."),
    ("place.kings_bridge", "King's Bridge is a wide stone bridge over the river Wend, guarded "
     "by soldiers who collect a toll of one copper coin."),
    ("place.rope_bridge", "A narrow rope bridge crosses the Sunder Gorge in the hills; it "
     "sways in the wind and carries only one walker at a time."),
    ("place.drowned_abbey", "The Drowned Abbey lies half under the water of Lake Merrow; its "
     "bell can still be heard ringing on stormy nights."),
    ("place.elderwood", "The Elderwood is a dense old forest west of the vale, home to deer, "
     "wolves and the wood-elves who guard it."),
    ("place.crossroads_inn", "The Three Lanterns is an inn at the crossroads south of "
     "Ashcombe, where merchants rest their horses and trade news."),
    ("place.sunken_crypt", "Beneath the chapel of Ashcombe lies a sealed crypt where the "
     "village's founders are buried with their swords."),
    ("place.watchtower", "Tallow Watchtower stands on the ridge above the Greyfen; its beacon "
     "is lit when raiders are seen on the eastern road."),
    ("place.marketplace", "Quillemarch's market square fills every seventh day with traders "
     "selling spices, parchment and bolts of dyed cloth."),

    # ---- people
    ("person.ysolde", "Ysolde Varrowen is the head librarian of Quillemarch, a stern woman "
     "who lends rare books only to those who bring one in exchange."),
    ("person.brenna", "Brenna is the innkeeper of the Three Lanterns, a cheerful widow who "
     "cooks a famous mutton stew and hears every rumour."),
    ("person.garrick", "Garrick is the blacksmith of Ashcombe, a broad man who forges "
     "ploughshares and horseshoes and mends farm tools."),
    ("person.torva", "Torva Ironhand is the weaponsmith of Ironholt; her blades are the best "
     "in the north and she sells them only to sworn soldiers."),
    ("person.aldric", "Lord Aldric rules the vale from Highmoor Keep; he is old and ill, and "
     "his two sons quarrel over who will inherit."),
    ("person.merriel", "Merriel is a wood-elf ranger of the Elderwood who guides lost "
     "travellers out of the forest in return for news of the outside world."),
    ("person.old_fenn", "Old Fenn is a hermit who lives in a stilt hut in the Greyfen and "
     "brews remedies from marsh herbs."),
    ("person.captain_roe", "Captain Roe commands the soldiers at King's Bridge; he is honest "
     "but strict, and he never lets anyone cross without paying."),
    ("person.sister_alva", "Sister Alva tends the chapel of Ashcombe and heals the sick; she "
     "keeps the only key to the crypt below."),
    ("person.dax", "Dax is a pickpocket in the Quillemarch market who will sell stolen maps "
     "and secrets for silver."),
    ("person.maren", "Maren is a fisherwoman of Saltmere who owns the fastest boat on the "
     "coast and ferries passengers to the islands."),
    ("person.oswin", "Oswin is a young scribe of Quillemarch who dreams of adventure and "
     "copies old maps late into the night."),
    ("person.the_grey_witch", "The Grey Witch is a sorceress said to live at the bottom of "
     "Lake Merrow; fishermen leave bread on the shore to keep her calm."),
    ("person.hobb", "Hobb is the miller of Ashcombe; his mill wheel broke last spring and the "
     "village has had to carry its grain to the next valley."),
    ("person.kestrel", "Kestrel is a mercenary captain who leads the Red Hounds, a band of "
     "sellswords that will fight for whoever pays the most."),

    # ---- items
    ("item.moonblade", "The Moonblade is a silver sword that glows faintly at night and cuts "
     "through the shadows of restless spirits."),
    ("item.ember_stone", "An ember stone is a red crystal from Ember Peak that stays warm for "
     "days; travellers carry one to survive the winter cold."),
    ("item.healing_draught", "A healing draught is a bitter green potion that closes wounds "
     "within an hour; Old Fenn sells them for two silver each."),
    ("item.night_eye", "Night-eye tonic is a potion that lets the drinker see in darkness "
     "until dawn, favoured by miners and thieves."),
    ("item.fire_oil", "Fire oil is a potion that bursts into flame when the flask breaks; "
     "it is forbidden inside the walls of Quillemarch."),
    ("item.wend_map", "The Wend map is an old chart of the river showing a forgotten ford "
     "below King's Bridge where no toll is taken."),
    ("item.bell_clapper", "The bronze clapper of the Drowned Abbey's bell was stolen long "
     "ago; the abbey's ghosts will not rest until it is returned."),
    ("item.thornwake_seal", "The Thornwake seal is a wax stamp of the old council; any letter "
     "bearing it is obeyed by every guard in the vale."),
    ("item.elven_cloak", "An elven cloak is woven by the wood-elves from grey leaves and makes "
     "its wearer hard to see among trees."),
    ("item.mill_gear", "A new iron gear for Hobb's mill wheel must be forged in Ironholt, "
     "since Garrick's forge is too small to cast one."),
    ("item.silver_ore", "Silver ore from the deep shafts of Ironholt is traded at "
     "Quillemarch for twice its weight in iron."),
    ("item.horn_of_tallow", "The Horn of Tallow hangs in the watchtower; its call can be "
     "heard across the whole Greyfen."),
    ("item.mutton_stew", "Brenna's mutton stew is cooked with barley from Ashcombe and costs "
     "three copper a bowl at the Three Lanterns."),
    ("item.scribe_ink", "Quillemarch scribes write with a blue ink made from crushed marsh "
     "beetles that never fades."),
    ("item.lantern_of_ways", "The Lantern of Ways is a brass lamp whose flame leans toward "
     "the nearest way out of any maze or cave."),

    # ---- quests, events, factions
    ("quest.mill_wheel", "Hobb asks the player to bring a new gear from Ironholt so the mill "
     "can turn again before the harvest."),
    ("quest.abbey_bell", "To quiet the ghosts of the Drowned Abbey, the player must find the "
     "stolen bell clapper and hang it back in the bell."),
    ("quest.heir", "Lord Aldric's steward secretly asks the player to find out which of the "
     "two sons poisoned the lord's wine."),
    ("quest.lost_scribe", "Oswin the scribe went into the Greyfen to map it and has not come "
     "back; Ysolde offers a rare book to whoever finds him."),
    ("quest.raiders", "Raiders have burned farms on the eastern road; Captain Roe pays a "
     "bounty of ten silver for each raider banner brought to him."),
    ("quest.witch_bread", "Maren will ferry the player to the islands for free if they leave "
     "a loaf of bread on the shore of Lake Merrow at midnight."),
    ("faction.thornwake", "The Thornwake Compact was the council of seven towns that ruled "
     "the vale before the lords; its last members meet in secret."),
    ("faction.red_hounds", "The Red Hounds are a mercenary company of forty swords camped near "
     "the Three Lanterns, waiting for a new contract."),
    ("faction.wood_elves", "The wood-elves of the Elderwood allow no one to cut living trees; "
     "woodcutters who do are never seen again."),
    ("event.harvest_fair", "Every autumn Ashcombe holds a harvest fair with a ploughing "
     "contest, a barley-ale tasting and a dance around the mill."),
    ("event.great_flood", "Eighty years ago the Great Flood drowned the abbey on Lake Merrow "
     "and changed the course of the river Wend."),
    ("event.eruption", "Ember Peak last erupted in the reign of Aldric's grandfather, burying "
     "the old road to Ironholt under ash."),
    ("lore.toll_law", "By the law of the vale, everyone who crosses a royal bridge pays the "
     "toll, except priests and children under twelve."),
    ("lore.curfew", "Quillemarch closes its gates at sunset; anyone outside must wait until "
     "dawn or pay the gatekeeper a silver coin."),
    ("lore.wolf_winter", "In hard winters wolves come down from the Elderwood and hunt "
     "sheep in the fields around Ashcombe."),
]

# (question, ids of the records that answer it)
QUESTIONS = [
    ("Where can I find books about old roads?", ["place.quillemarch"]),
    ("Who runs the library in the city of scribes?", ["person.ysolde"]),
    ("What does Ysolde Varrowen want before she lends a book?", ["person.ysolde"]),
    ("Who can fix my broken plough?", ["person.garrick"]),
    ("Where do I buy a really good sword in the north?", ["person.torva"]),
    ("Is there somewhere to eat and rest near the crossroads?",
     ["place.crossroads_inn", "person.brenna"]),
    ("How much does a bowl of stew cost at the inn?", ["item.mutton_stew"]),
    ("Why is the village carrying grain to another valley?", ["person.hobb", "quest.mill_wheel"]),
    ("What do I need to get the mill working again?", ["quest.mill_wheel", "item.mill_gear"]),
    ("How do I cross the river without paying?", ["item.wend_map"]),
    ("Who has to pay to cross the king's bridge?", ["lore.toll_law", "place.kings_bridge"]),
    ("Who commands the guards at the bridge?", ["person.captain_roe"]),
    ("Is there a potion that heals injuries?", ["item.healing_draught"]),
    ("How can I see in the dark inside the mine?", ["item.night_eye"]),
    ("What is dangerous to carry into Quillemarch?", ["item.fire_oil"]),
    ("How do I keep warm when travelling in winter?", ["item.ember_stone"]),
    ("Which weapon works against ghosts?", ["item.moonblade"]),
    ("Why does a bell ring from the lake during storms?", ["place.drowned_abbey"]),
    ("How can the spirits of the abbey be put to rest?", ["quest.abbey_bell", "item.bell_clapper"]),
    ("What happened to the abbey on the lake?", ["event.great_flood"]),
    ("Who lives in the marsh and makes medicine?", ["person.old_fenn"]),
    ("Where did the young map-maker disappear?", ["quest.lost_scribe"]),
    ("Who rules this land and is he healthy?", ["person.aldric"]),
    ("Someone poisoned the old lord, who wants me to investigate?", ["quest.heir"]),
    ("What was the Thornwake Compact?", ["faction.thornwake"]),
    ("What does a letter with the old council's stamp do?", ["item.thornwake_seal"]),
    ("Can I hire soldiers for a fight?", ["faction.red_hounds", "person.kestrel"]),
    ("Who leads the sellswords?", ["person.kestrel"]),
    ("Who can guide me out of the forest?", ["person.merriel"]),
    ("What happens if I chop down trees in the forest?", ["faction.wood_elves"]),
    ("How do I become hard to spot among trees?", ["item.elven_cloak"]),
    ("Where is the mountain that smokes?", ["place.ember_peak"]),
    ("Why is the old road to the mining town buried?", ["event.eruption"]),
    ("Who can take me by boat to the islands?", ["person.maren", "quest.witch_bread"]),
    ("Who buys stolen maps in the market?", ["person.dax"]),
    ("When do the city gates close?", ["lore.curfew"]),
    ("What signal warns of raiders on the eastern road?", ["place.watchtower", "item.horn_of_tallow"]),
    ("Is there a reward for fighting the raiders?", ["quest.raiders"]),
    ("Where do people find their way out of a labyrinth?", ["item.lantern_of_ways"]),
    ("Where is Quillemarch?", ["place.quillemarch"]),
]

IDS = [rid for rid, _ in RECORDS]
TEXTS = [text for _, text in RECORDS]
assert len(set(IDS)) == len(IDS)
assert all(a in IDS for _, answers in QUESTIONS for a in answers)


_NAMES = ["Aldwin", "Berra", "Corwin", "Dessa", "Elric", "Fiora", "Gideon", "Hale", "Isolde",
          "Jory", "Kara", "Lucan", "Mira", "Nolan", "Orla", "Pell", "Quenna", "Rowan",
          "Sabine", "Tamsin"]
_TRADES = ["blacksmith", "herbalist", "ferryman", "cartographer", "innkeeper", "hunter",
           "stonemason", "brewer", "tanner", "priest", "guard captain", "merchant"]
_PLACES = ["Ashcombe", "Quillemarch", "Ironholt", "Saltmere", "the Greyfen", "the Elderwood",
           "King's Bridge", "Lake Merrow", "Highmoor Keep", "Ember Peak", "Tallow Watchtower"]
_DEEDS = ["sells {item} to travellers for {n} silver",
          "is searching for a lost {item} last seen near {place}",
          "owes a debt to the Red Hounds and hides in {place}",
          "knows a secret path from {place} to {place2}",
          "will trade {item} for news of the raiders on the eastern road",
          "was born in {place2} and has never left the vale",
          "guards the road between {place} and {place2} at night",
          "keeps a map of {place} that shows a hidden cellar"]
_ITEMS = ["a healing draught", "an ember stone", "a silver ring", "an elven cloak",
          "an iron key", "a book of songs", "a brass lantern", "a bow of yew",
          "a bag of barley", "a bottle of fire oil"]


def lore_records(n: int, seed: int = 0) -> list[str]:
    """`n` lore-like records: the 60 above, then generated ones of the same shape and
    length (one or two sentences, 15 to 40 tokens), the same on every call."""
    import random

    rng = random.Random(seed)
    out = list(TEXTS[:n])
    while len(out) < n:
        place, place2 = rng.sample(_PLACES, 2)
        deed = rng.choice(_DEEDS).format(item=rng.choice(_ITEMS), n=rng.randint(2, 40),
                                         place=place, place2=place2)
        text = f"{rng.choice(_NAMES)} the {rng.choice(_TRADES)} of {place} {deed}."
        if rng.random() < 0.5:
            text += f" Ask at the inn of {rng.choice(_PLACES)} for more."
        out.append(text)
    return out
