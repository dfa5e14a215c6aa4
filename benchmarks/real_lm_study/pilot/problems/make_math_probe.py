import json
import random
from pathlib import Path

rng = random.Random(7)
fams = {
    "mul2x2": lambda: (lambda a, b: (f"What is ${a} \\cdot {b}$?", a * b))(rng.randint(11, 99), rng.randint(11, 99)),
    "mul2x1": lambda: (lambda a, b: (f"What is ${a} \\cdot {b}$?", a * b))(rng.randint(11, 99), rng.randint(2, 9)),
    "sum3": lambda: (lambda a, b, c: (f"What is ${a} + {b} + {c}$?", a + b + c))(
        rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99)
    ),
    "ab_plus_cd": lambda: (lambda a, b, c, d: (f"What is ${a} \\cdot {b} + {c} \\cdot {d}$?", a * b + c * d))(
        rng.randint(11, 99), rng.randint(2, 9), rng.randint(11, 99), rng.randint(2, 9)
    ),
    "sum3x3": lambda: (lambda a, b: (f"What is ${a} + {b}$?", a + b))(rng.randint(100, 999), rng.randint(100, 999)),
}
for name, f in fams.items():
    with open(Path(__file__).parent / f"{name}.jsonl", "w") as fh:
        for i in range(32):
            q, a = f()
            fh.write(json.dumps({"question": q, "answer": str(a), "id": f"{name}-{i}", "source": name}) + "\n")
