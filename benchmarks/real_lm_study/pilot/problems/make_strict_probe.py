import json
import random
from pathlib import Path

rng = random.Random(11)
R = rng.randint
fams = {
    "add2": lambda: (lambda a, b: (f"What is ${a} + {b}$?", a + b))(R(10, 99), R(10, 99)),
    "add3d": lambda: (lambda a, b: (f"What is ${a} + {b}$?", a + b))(R(100, 999), R(100, 999)),
    "add3": lambda: (lambda a, b, c: (f"What is ${a} + {b} + {c}$?", a + b + c))(R(10, 99), R(10, 99), R(10, 99)),
    "mul2x1": lambda: (lambda a, b: (f"What is ${a} \\cdot {b}$?", a * b))(R(11, 99), R(2, 9)),
    "mul1x1": lambda: (lambda a, b: (f"What is ${a} \\cdot {b}$?", a * b))(R(2, 9), R(2, 9)),
}
for name, f in fams.items():
    with open(Path(__file__).parent / f"s_{name}.jsonl", "w") as fh:
        for i in range(48):
            q, a = f()
            fh.write(json.dumps({"question": q, "answer": str(a), "id": f"{name}-{i}", "source": name}) + "\n")
