"""Offline catalogue generator: a deterministic WebShop-schema catalogue made by our own code.

Maps to webshop.md §5 ("a generated catalogue in the same schema"): `generate_catalogue(seed, n)`
returns `(raw_products, attributes)` in exactly the official file formats (§2): a list like
`items_shuffle_1000.json` and a dict like `items_ins_v2_1000.json`, so the generated data goes
through the same loader, goal builder, search index and reward as the real files.

What it contains: ~40 product types over WebShop's coarse categories (beauty, electronics,
fashion, food, furniture, garden), each with an Amazon search query, a breadcrumb, title nouns,
an attribute vocabulary (adjective-like, "with ..." and "for ..." phrases, in WebShop's style) and
option groups. Every product gets a brand, 3-6 attributes (some in the title, all somewhere in the
text), bullet points, a description, 0-2 option groups, a single / ranged / missing price, and
~40 % of products get a synthetic "Find me ..." instruction over 2-4 of their attributes (WebShop's
real ratio is 415/1000). Many products share a type, so search, attributes, options, prices and
the type factor all decide the reward.

`hybrid_catalogue(attributes, seed)` builds products for the ASINs of a real `items_ins_v2` file,
keeping its real attributes and instructions (webshop.md §5 plan); used by tests with real data.

Deviations: text is generated, cleaner than scraped Amazon text (absolute scores are not
comparable with published WebShop numbers); no images (MainImage is empty).
"""
from __future__ import annotations

import random
import re
import string

CATEGORY_ROOTS = {
    "fashion": "Clothing, Shoes & Jewelry",
    "beauty": "Beauty & Personal Care",
    "electronics": "Electronics",
    "food": "Grocery & Gourmet Food",
    "furniture": "Home & Kitchen",
    "garden": "Patio, Lawn & Garden",
}

PALETTES = {
    "apparel_color": (
        "black|white|navy blue|heather grey|red|dark green|beige|pink|brown|light blue|burgundy|"
        "khaki|black/white|olive|purple"
    ),
    "apparel_size": "x-small|small|medium|large|x-large|xx-large|3x-large",
    "shoe_size": "6|6.5|7|7.5|8|8.5|9|9.5|10|10.5|11|12",
    "denim": "light wash|medium wash|dark wash|black|stone wash|grey",
    "waist": "28w x 30l|30w x 30l|32w x 32l|34w x 32l|36w x 34l|38w x 34l",
    "scent": "lavender|unscented|coconut|rose|eucalyptus mint|vanilla|citrus|tea tree",
    "beauty_size": (
        "1 fl oz (pack of 1)|3.4 fl oz (pack of 1)|8 fl oz (pack of 2)|16 fl oz (pack of 1)|"
        "32 fl oz (pack of 1)"
    ),
    "shade": (
        "01 ivory|02 natural beige|03 warm sand|04 honey|05 caramel|06 mocha|nude|berry|coral|"
        "ruby red"
    ),
    "pieces": "5 pcs|10 pcs|14 pcs|18 pcs|24 pcs",
    "device_color": "black|white|silver|space gray|blue|rose gold|green",
    "watts": "1200w|1600w|1875w|2000w",
    "phone_model": "iphone 13|iphone 13 pro|iphone 14|galaxy s22|galaxy s23|pixel 7",
    "cable_length": "3 ft|6 ft|10 ft|15 ft|25 ft",
    "pack": "1 pack|2 pack|3 pack|4 pack|6 pack",
    "capacity": "32gb|64gb|128gb|256gb|512gb",
    "tv_size": "32 inch|43 inch|50 inch|55 inch|65 inch|75 inch",
    "mah": "5000mah|10000mah|20000mah|26800mah",
    "flavor": (
        "original|honey roasted|sea salt|dark chocolate|vanilla|strawberry|spicy chili|barbecue|"
        "cinnamon|matcha|peanut butter|salted caramel"
    ),
    "roast": "light roast|medium roast|dark roast|french roast|espresso roast|decaf",
    "food_size": (
        "4 ounce (pack of 6)|8 ounce (pack of 1)|12 ounce (pack of 2)|1 pound (pack of 1)|"
        "2 pound (pack of 1)|24 count (pack of 1)|6 count (pack of 4)"
    ),
    "tea_count": (
        "20 count (pack of 1)|20 count (pack of 6)|40 count (pack of 2)|100 count (pack of 1)"
    ),
    "wood_color": (
        "natural|espresso|walnut|white|black|grey|rustic brown|oak|navy blue|light grey|beige|"
        "green"
    ),
    "table_width": "24 inch|31.5 inch|40 inch|47 inch|55 inch",
    "bed_size": "twin|full|queen|king|california king",
    "tiers": "3 tier|4 tier|5 tier|6 tier",
    "rug_size": "2 ft x 3 ft|3 ft x 5 ft|4 ft x 6 ft|5 ft x 7 ft|8 ft x 10 ft",
    "art_size": "12x16 inch|16x24 inch|24x36 inch|3 panels 16x24 inch",
    "hose_length": "25 ft|50 ft|75 ft|100 ft",
    "pot_size": "4 inch|6 inch|8 inch|10 inch|12 inch",
    "light_color": "warm white|cool white|multicolor|color changing",
    "garden_size": "small|medium|large|2 pack|4 pack",
}

# One block per product type: "category | query | breadcrumb below the root | price range", then the title
# nouns, the adjective-like / "with ..." / "for ..." attributes (";"-separated) and the option groups
# ("name:palette:min-max", ","-separated).
PRODUCT_TYPES = """
fashion | men's dress shirts | Men > Clothing > Shirts > Dress Shirts | 15-60
  nouns: dress shirt;button down shirt;oxford shirt
  pre: slim fit;long sleeve;wrinkle free;machine wash;classic fit;regular fit
  with: button closure;cotton blend;spread collar
  for: daily wear;business;wedding
  options: color:apparel_color:2-5,size:apparel_size:2-5

fashion | women's t-shirts | Women > Clothing > Tops, Tees & Blouses > T-Shirts | 8-35
  nouns: t-shirt;tee shirt;crewneck tee
  pre: short sleeve;loose fit;machine wash;soft material;classic fit
  with: graphic print;polyester spandex;round neck
  for: daily wear;gym workout;summer
  options: color:apparel_color:2-5,size:apparel_size:2-5

fashion | men's fashion sneakers | Men > Shoes > Fashion Sneakers | 25-120
  nouns: sneaker;running shoe;walking shoe
  pre: non slip;lightweight;breathable;lace up
  with: rubber sole;memory foam;mesh upper
  for: walking;gym workout;daily wear
  options: color:apparel_color:2-4,size:shoe_size:3-6

fashion | women's jeans | Women > Clothing > Jeans | 20-70
  nouns: jeans;skinny jeans;straight leg jeans
  pre: high waist;slim fit;machine wash;stretch fabric;button closure
  with: zipper fly;front pockets;cotton spandex
  for: daily wear;casual outings
  options: color:denim:2-4,size:waist:2-5

fashion | women's dresses | Women > Clothing > Dresses | 18-65
  nouns: maxi dress;midi dress;sundress
  pre: short sleeve;long sleeve;hand wash;loose fit;v neck
  with: floral print;side pockets;elastic waist
  for: summer;party;beach
  options: color:apparel_color:2-5,size:apparel_size:2-5

fashion | men's hoodies | Men > Clothing > Fashion Hoodies & Sweatshirts | 20-55
  nouns: hoodie;pullover hoodie;zip up hoodie
  pre: long sleeve;machine wash;fleece lined;relaxed fit
  with: drawstring closure;kangaroo pocket;polyester cotton
  for: winter;daily wear;gym workout
  options: color:apparel_color:2-5,size:apparel_size:2-5

fashion | athletic socks | Men > Clothing > Socks > Athletic Socks | 9-30
  nouns: athletic socks;crew socks;ankle socks
  pre: moisture wicking;breathable;machine wash;cushioned sole
  with: arch support;cotton blend
  for: running;hiking;daily wear
  options: color:apparel_color:2-4,size:pack:2-3

beauty | shampoo & conditioner | Hair Care > Shampoo & Conditioner > Shampoo & Conditioner Sets | 9-45
  nouns: shampoo;conditioner set;shampoo and conditioner
  pre: sulfate free;paraben free;cruelty free;natural ingredients
  with: argan oil;coconut oil;tea tree;biotin
  for: damaged hair;dry hair;hair growth;hair loss
  options: scent:scent:2-4,size:beauty_size:2-3

beauty | face moisturizers | Skin Care > Face > Creams & Moisturizers > Face Moisturizers | 10-60
  nouns: face moisturizer;face cream;day cream
  pre: oil free;fragrance free;dermatologist tested;non comedogenic
  with: hyaluronic acid;vitamin c;shea butter;aloe vera
  for: sensitive skin;dry skin;fine lines;dark spots
  options: size:beauty_size:2-4

beauty | lipstick | Makeup > Lips > Lipstick | 6-30
  nouns: lipstick;matte lipstick;lip color
  pre: long lasting;cruelty free;waterproof;highly pigmented
  with: vitamin e;shea butter;matte finish
  for: everyday makeup;party
  options: color:shade:3-6

beauty | scrubs & body treatments | Skin Care > Body > Scrubs & Body Treatments | 8-40
  nouns: body scrub;exfoliating scrub;sugar scrub
  pre: paraben free;cruelty free;certified organic;non toxic
  with: essential oils;sea salt;coconut oil;tea tree
  for: dead skin;dry skin;sensitive skin
  options: scent:scent:2-4,size:beauty_size:1-3

beauty | makeup brush sets | Tools & Accessories > Makeup Brushes & Tools > Brush Sets | 7-35
  nouns: makeup brush set;brush set;foundation brush
  pre: easy clean;high quality;cruelty free;travel size
  with: synthetic hair;storage case;wooden handle
  for: foundation;eye shadow;beauty salon
  options: color:device_color:2-4,size:pieces:2-4

beauty | hair dryers | Tools & Accessories > Hair Styling Tools > Hair Dryers | 20-120
  nouns: hair dryer;blow dryer;ionic hair dryer
  pre: fast drying;lightweight;low noise;long lasting
  with: diffuser;ceramic tourmaline;negative ions
  for: hair styling;beauty salon;travel
  options: color:device_color:2-4,style:watts:2-3

beauty | nail polish | Foot, Hand & Nail Care > Nail Art & Polish > Nail Polish | 5-25
  nouns: nail polish;gel nail polish;nail lacquer
  pre: quick dry;long lasting;non toxic;cruelty free
  with: gel formula;glitter finish
  for: nail art;manicure
  options: color:shade:3-6,size:pack:1-3

electronics | over-ear headphones | Headphones, Earbuds & Accessories > Headphones > Over-Ear Headphones | 25-300
  nouns: wireless headphones;over ear headphones;noise cancelling headphones
  pre: noise cancelling;wireless bluetooth;long battery life;hands free
  with: built-in microphone;carrying case;usb type-c
  for: travel;home office;gaming
  options: color:device_color:2-5

electronics | basic phone cases | Cell Phones & Accessories > Cases, Holsters & Sleeves > Basic Cases | 8-35
  nouns: phone case;protective case;clear case
  pre: shockproof;slim fit;wireless charging;heavy duty
  with: tempered glass;screen protector;kickstand
  for: daily use;outdoor use
  options: color:device_color:2-5,style:phone_model:2-4

electronics | hdmi cables | Accessories & Supplies > Audio & Video Accessories > Cables > HDMI Cables | 6-30
  nouns: hdmi cable;high speed hdmi cable;4k hdmi cord
  pre: high speed;gold plated;braided nylon;plug play
  with: ethernet support;4k resolution
  for: home theater;gaming;monitor
  options: size:cable_length:2-5,style:pack:1-3

electronics | usb flash drives | Computers & Accessories > Data Storage > USB Flash Drives | 6-60
  nouns: usb flash drive;thumb drive;memory stick
  pre: high speed;usb 3.0;plug play;water resistant
  with: key ring;metal casing
  for: data storage;laptop;car stereo
  options: capacity:capacity:2-5,style:pack:1-3

electronics | televisions | Television & Video > Televisions | 150-1300
  nouns: smart tv;led tv;4k ultra hd tv
  pre: high definition;ultra hd;dolby vision;wall mountable
  with: remote control;built-in wifi;hdmi ports
  for: living room;home theater;gaming
  options: size:tv_size:2-4

electronics | portable power banks | Cell Phones & Accessories > Chargers & Power Adapters > Portable Power Banks | 12-70
  nouns: power bank;portable charger;battery pack
  pre: fast charging;high capacity;lightweight;compact design
  with: usb type-c;led display;dual usb
  for: travel;camping;iphone
  options: color:device_color:2-4,capacity:mah:2-4

food | ground coffee | Beverages > Coffee, Tea & Cocoa > Coffee > Ground Coffee | 8-40
  nouns: ground coffee;whole bean coffee;coffee beans
  pre: gluten free;non gmo;usda organic;fair trade;low acid
  with: arabica beans;rich aroma
  for: french press;drip coffee;espresso
  options: flavor name:roast:2-4,size:food_size:2-3

food | protein bars | Snack Foods > Bars > Protein Bars | 10-45
  nouns: protein bar;snack bar;granola bar
  pre: gluten free;non gmo;low sugar;high protein;keto friendly
  with: real fruit;almond butter;dark chocolate
  for: breakfast;post workout;snacks
  options: flavor name:flavor:2-5,size:food_size:2-3

food | herbal tea | Beverages > Coffee, Tea & Cocoa > Tea > Herbal Tea | 5-30
  nouns: tea bags;herbal tea;green tea
  pre: caffeine free;usda organic;non gmo;sugar free
  with: natural ingredients;individually wrapped
  for: relaxation;sleep;digestion
  options: flavor name:flavor:2-4,size:tea_count:2-3

food | mixed nuts | Snack Foods > Nuts & Seeds > Mixed Nuts | 8-40
  nouns: mixed nuts;trail mix;roasted almonds
  pre: gluten free;low sodium;non gmo;kosher certified
  with: sea salt;dark chocolate;resealable bag
  for: snacks;keto diet;road trips
  options: flavor name:flavor:2-4,size:food_size:2-3

food | chocolate candy | Candy & Chocolate > Chocolate > Chocolate Bars | 6-45
  nouns: chocolate bar;chocolate gift box;truffles
  pre: individually wrapped;gluten free;kosher certified;nut free
  with: milk chocolate;dark chocolate;caramel filling
  for: valentine day;birthday gift;party favors
  options: flavor name:flavor:2-4,size:food_size:1-3

food | seasoning blends | Pantry Staples > Herbs, Spices & Seasonings > Mixed Spices & Seasonings | 5-25
  nouns: seasoning blend;spice rub;seasoning mix
  pre: non gmo;gluten free;salt free;kosher certified
  with: natural ingredients;glass jar
  for: grilling;cooking;meal prep
  options: flavor name:flavor:2-4,size:food_size:1-3

furniture | console tables | Furniture > Living Room Furniture > Tables > Console Tables | 45-320
  nouns: console table;sofa table;entryway table
  pre: easy assemble;solid wood;rustic style;metal frame
  with: storage shelf;storage space;drawers
  for: living room;entryway;hallway
  options: color:wood_color:2-5,size:table_width:2-3

furniture | home office desk chairs | Furniture > Home Office Furniture > Home Office Chairs > Desk Chairs | 50-350
  nouns: office chair;desk chair;ergonomic chair
  pre: ergonomic design;height adjustable;easy assemble;heavy duty
  with: lumbar support;mesh back;padded armrests
  for: home office;gaming;long hours
  options: color:wood_color:2-5

furniture | bed frames | Furniture > Bedroom Furniture > Beds, Frames & Bases > Bed Frames | 90-700
  nouns: platform bed frame;bed frame;metal bed frame
  pre: heavy duty;easy assemble;noise free;no box spring needed
  with: storage space;headboard;wood slats
  for: bedroom;guest room;kids room
  options: color:wood_color:2-4,size:bed_size:2-4

furniture | bookcases | Furniture > Home Office Furniture > Bookcases | 40-260
  nouns: bookshelf;bookcase;ladder shelf
  pre: easy assemble;space saving;solid wood;industrial style
  with: open shelves;metal frame;anti tip kit
  for: living room;home office;bedroom
  options: color:wood_color:2-5,size:tiers:2-3

furniture | accent chairs | Furniture > Living Room Furniture > Chairs > Accent Chairs | 80-450
  nouns: accent chair;armchair;club chair
  pre: mid century;easy assemble;high density foam
  with: wood legs;velvet fabric;removable cushion
  for: living room;bedroom;reading nook
  options: color:wood_color:2-5

furniture | area rugs | Home Decor Products > Area Rugs, Runners & Pads > Area Rugs | 25-300
  nouns: area rug;shag rug;runner rug
  pre: non slip;machine washable;easy clean;stain resistant
  with: rubber backing;soft pile
  for: living room;dining room;bedroom
  options: color:wood_color:2-5,size:rug_size:2-5

furniture | wall art | Home Decor Products > Wall Art > Canvas Art | 15-150
  nouns: canvas wall art;framed print;wall decor
  pre: ready hang;high definition;waterproof
  with: wood frame;canvas print
  for: living room;bedroom;home decor
  options: size:art_size:2-4

garden | garden hoses | Watering Equipment > Garden Hoses | 18-90
  nouns: garden hose;expandable hose;water hose
  pre: heavy duty;leak proof;lightweight;kink free
  with: spray nozzle;brass fittings
  for: lawn care;car wash;garden
  options: size:hose_length:2-4,color:device_color:1-3

garden | planters | Gardening & Lawn Care > Pots, Planters & Container Accessories > Planters | 10-80
  nouns: planter pot;flower pot;plant pot
  pre: uv resistant;lightweight;indoor outdoor;easy clean
  with: drainage hole;saucer;bamboo fiber
  for: indoor plants;succulents;patio
  options: color:wood_color:2-5,size:pot_size:2-4

garden | solar pathway lights | Outdoor Decor > Outdoor Lighting > Pathway Lights | 15-70
  nouns: solar pathway light;solar garden light;landscape light
  pre: waterproof;auto on off;energy saving;easy install
  with: warm white led;stainless steel
  for: yard;pathway;patio
  options: color:light_color:2-4,size:pack:2-4

garden | bird feeders | Birding & Wildlife > Bird Feeders | 14-75
  nouns: bird feeder;hanging feeder;squirrel feeder
  pre: squirrel proof;weather resistant;easy clean;easy fill
  with: metal roof;multiple perches
  for: wild birds;backyard;garden
  options: color:device_color:2-4,size:garden_size:2-3

garden | patio seat cushions | Patio Furniture & Accessories > Cushions > Seat Cushions | 15-85
  nouns: patio cushion;seat cushion;chair pad
  pre: water resistant;fade resistant;uv resistant;machine washable
  with: secure ties;zipper closure
  for: patio furniture;outdoor chairs;dining chairs
  options: color:apparel_color:2-5,size:garden_size:2-3
"""

_FILLERS = [
    "built for everyday use",
    "tested for quality and durability",
    "a thoughtful choice for gifting",
    "backed by our friendly customer service",
    "designed with attention to detail",
    "made to keep its shape and finish",
    "a favorite of thousands of customers",
]
_SYLLABLES = ("ka lo ve ri to na mi zo ber lan dor qu sen tia rex vo el ar nix pra so lu fen gri ho ma ta "
              "wen").split()


def parse_product_types() -> list[dict]:
    types = []
    for block in PRODUCT_TYPES.strip().split("\n\n"):
        head, *rows = block.strip().splitlines()
        category, query, crumbs, price = (part.strip() for part in head.split("|"))
        fields = {key.strip(): value.strip() for key, value in (row.split(":", 1) for row in rows)}
        groups = []
        for spec in filter(None, fields["options"].split(",")):
            name, palette, counts = spec.strip().split(":")
            low, high = (int(x) for x in counts.split("-"))
            groups.append((name, PALETTES[palette].split("|"), low, high))
        low, high = (float(x) for x in price.split("-"))
        types.append({
            "category": category,
            "query": query,
            "breadcrumb": " › ".join([CATEGORY_ROOTS[category]] + crumbs.split(" > ")),
            "nouns": fields["nouns"].split(";"),
            "pre": fields["pre"].split(";"),
            "with": fields["with"].split(";"),
            "for": fields["for"].split(";"),
            "options": groups,
            "price": (low, high),
        })
    return types


def _title_case(text: str) -> str:
    return " ".join(w if any(c.isdigit() for c in w) else w[:1].upper() + w[1:] for w in text.split())


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _brands(rng: random.Random, count: int = 150) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
        if name not in names and 4 <= len(name) <= 10:
            names.append(name)
    return names


def _slot(ptype: dict, attribute: str) -> str:
    for slot in ("pre", "with", "for"):
        if attribute in ptype[slot]:
            return slot
    return "pre"


def make_instruction(ptype: dict, query: str, attributes: list[str]) -> str:
    """WebShop-style synthetic instruction: 'Find me <adj> <query> with <x> for <y>'."""
    by_slot: dict[str, list[str]] = {"pre": [], "with": [], "for": []}
    for attribute in attributes:
        by_slot[_slot(ptype, attribute)].append(attribute)
    text = "Find me " + (", ".join(by_slot["pre"]) + " " if by_slot["pre"] else "") + query
    if by_slot["with"]:
        text += " with " + ", ".join(by_slot["with"])
    if by_slot["for"]:
        text += " for " + ", ".join(by_slot["for"])
    return text


def _price(rng: random.Random, low: float, high: float) -> str:
    roll = rng.random()
    value = round(rng.uniform(low, high), 2)
    if roll < 0.02:
        return ""
    if roll < 0.27:
        return f"${value:,.2f} - ${round(value * rng.uniform(1.1, 1.6), 2):,.2f}"
    return f"${value:,.2f}"


def _options(rng: random.Random, ptype: dict) -> dict:
    options = {}
    for name, palette, low, high in ptype["options"]:
        if rng.random() < 0.08:  # a few products lack a group
            continue
        count = min(len(palette), rng.randint(low, high))
        values = sorted(rng.sample(range(len(palette)), count))
        options[name] = [{"value": palette[i], "image": None} for i in values]
    return options


def _product(rng: random.Random, ptype: dict, asin: str, brand: str, attributes: list[str],
             noun: str | None = None) -> dict:
    """One raw product (official `items_shuffle` schema) whose text mentions all its attributes."""
    noun = noun or rng.choice(ptype["nouns"])
    in_title = [a for a in attributes if rng.random() < 0.6] or attributes[:1]
    pre = [a for a in in_title if _slot(ptype, a) == "pre"]
    title = f"{brand} " + " ".join(_title_case(a) for a in pre) + (" " if pre else "") + _title_case(noun)
    withs = [a for a in in_title if _slot(ptype, a) == "with"]
    fors = [a for a in in_title if _slot(ptype, a) == "for"]
    if withs:
        title += " with " + " and ".join(_title_case(a) for a in withs)
    if fors:
        title += " for " + _title_case(fors[0])
    bullets = [f"{_title_case(a)} - {rng.choice(_FILLERS)}." for a in rng.sample(attributes, len(attributes))]
    bullets.append(f"Package includes 1 {noun} from {brand}.")
    rest = [a for a in attributes if a not in in_title]
    description = (f"The {brand} {noun} is {rng.choice(_FILLERS)}. "
                   + (f"It offers {', '.join(rest)}. " if rest else "")
                   + f"Shop with confidence: every {ptype['query']} item from {brand} is {rng.choice(_FILLERS)}.")
    return {
        "asin": asin,
        "name": title,
        "brand": brand,
        "full_description": description,
        "small_description": bullets,
        "pricing": _price(rng, *ptype["price"]),
        "images": [],
        "product_category": ptype["breadcrumb"],
        "category": ptype["category"],
        "query": ptype["query"],
        "customization_options": _options(rng, ptype) or "",
        "average_rating": "N.A.",
    }


def generate_catalogue(seed: int = 0, num_products: int = 1000,
                       instruction_rate: float = 0.42) -> tuple[list[dict], dict]:
    """A deterministic catalogue: (raw products as in items_shuffle, attributes as in items_ins_v2)."""
    rng = random.Random(f"webshop-catalogue-{seed}")
    types = parse_product_types()
    brands = _brands(rng)
    taken: set[str] = set()
    raw_products, attributes = [], {}
    for index in range(num_products):
        ptype = types[index % len(types)] if index < len(types) else rng.choice(types)
        pool = ptype["pre"] + ptype["with"] + ptype["for"]
        chosen = rng.sample(pool, min(len(pool), rng.randint(3, 6)))
        asin = _asin(rng, taken)
        raw_products.append(_product(rng, ptype, asin, rng.choice(brands), chosen))
        entry: dict = {"attributes": chosen}
        if rng.random() < instruction_rate:
            goal_attributes = rng.sample(chosen, rng.randint(2, min(4, len(chosen))))
            ordered = [a for a in pool if a in goal_attributes]
            entry["instruction"] = make_instruction(ptype, ptype["query"], ordered)
            entry["instruction_attributes"] = ordered
        attributes[asin] = entry
    rng.shuffle(raw_products)
    return raw_products, attributes


# ----------------------------------------------------------------------------- hybrid (real ASINs)


def query_from_instruction(instruction: str, attributes: list[str]) -> str:
    """Recover the product query from a real 'Find me <adj> <query> with .. for ..' instruction."""
    text = re.sub(r"^find me\s+", "", instruction.strip().lower())
    text = re.split(r"\s+with\s+|\s+for\s+", text)[0]
    head = text.split(",")[-1].strip()
    for attribute in sorted(attributes, key=len, reverse=True):
        if head.startswith(attribute + " "):
            head = head[len(attribute):].strip()
    return head or text


def hybrid_catalogue(attributes: dict, seed: int = 0, limit: int = 0) -> list[dict]:
    """Generated raw products for the ASINs of a real `items_ins_v2` dict (real attributes kept).

    The product type is the generator type whose vocabulary overlaps the real attributes and
    instruction most; instructed products take the query read off their instruction (so the
    goal's query/title nouns are consistent with it).
    """
    rng = random.Random(f"webshop-hybrid-{seed}")
    types = parse_product_types()
    brands = _brands(rng)
    vocabularies = [set(" ".join(t["pre"] + t["with"] + t["for"] + t["nouns"] + [t["query"]]).split()) for t in types]
    raw_products = []
    for asin, entry in attributes.items():
        real = [a for a in entry.get("attributes", []) if isinstance(a, str)]
        words = set(" ".join(real + [entry.get("instruction", "")]).lower().split())
        best = max(range(len(types)), key=lambda i: (len(words & vocabularies[i]), rng.random()))
        ptype = types[best]
        noun = None
        if entry.get("instruction"):
            ptype = dict(ptype, query=query_from_instruction(entry["instruction"], real))
            noun = ptype["query"]
        raw_products.append(_product(rng, ptype, asin, rng.choice(brands), real or [ptype["nouns"][0]], noun))
        if limit and len(raw_products) >= limit:
            break
    return raw_products
