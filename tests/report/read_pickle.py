"""Prints, as JSON, the object pickled in the file named by argv[1] (meshsim's base/pickle.h)."""
import json
import pickle
import sys

with open(sys.argv[1], "rb") as f:
    print(json.dumps(pickle.load(f), ensure_ascii=False))
