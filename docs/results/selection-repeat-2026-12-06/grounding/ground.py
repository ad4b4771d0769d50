"""Is a call's argument values supported by the request's text? (analysis only)"""
import json, re, sys
sys.path.insert(0, '/work/main')

WORD = re.compile(r"[^\W_]{3,}|\d+(?:\.\d+)?", re.U)

def nums(text):
    return {float(x) for x in re.findall(r"\d+(?:\.\d+)?", text.replace(",", ""))}

def grounded_value(v, text_low, text_nums, schema):
    if isinstance(v, bool) or v is None:
        return None  # neutral
    if isinstance(schema, dict) and "enum" in schema:
        return None
    if isinstance(v, (int, float)):
        return float(v) in text_nums
    if isinstance(v, str):
        words = [w.lower() for w in WORD.findall(v)]
        if not words:
            return None
        text_words = set(w.lower() for w in WORD.findall(text_low))
        return any(w in text_words for w in words)
    if isinstance(v, list):
        rs = [grounded_value(x, text_low, text_nums, (schema or {}).get("items") if isinstance(schema, dict) else None) for x in v]
        rs = [r for r in rs if r is not None]
        return any(rs) if rs else None
    if isinstance(v, dict):
        props = (schema or {}).get("properties", {}) if isinstance(schema, dict) else {}
        rs = [grounded_value(x, text_low, text_nums, props.get(k)) for k, x in v.items()]
        rs = [r for r in rs if r is not None]
        return any(rs) if rs else None
    return None

def call_grounded(args, text, schema):
    """None: nothing to judge; True: some value is in the request; False: none is."""
    props = (schema or {}).get("properties", {})
    rs = [grounded_value(v, text.lower(), nums(text), props.get(k)) for k, v in args.items()]
    rs = [r for r in rs if r is not None]
    return any(rs) if rs else None
