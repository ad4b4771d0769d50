import json,re,ast,sys
sys.path.insert(0,'/work/main')
from loopstack.bench.agent.selection import selection_items, abstention_items
log, rowsf = sys.argv[1], sys.argv[2]
rows=[json.loads(l) for l in open(rowsf)]
probes={}
for line in open(log):
    if 'PROBE p_call' not in line: continue
    m=re.search(r"p_call=([\d.]+) ntools=(\d+) rule=(\d) top=(\[.*?\]) tail='<\|im_start\|>user (.*)",line)
    top=ast.literal_eval(m.group(4))
    q=m.group(5).split('<|im_end|>')[0]
    probes.setdefault(q[:60],[]).append(top)
def jm(top):
    return sum(p for p,k in top if k.lstrip().startswith('```') or k.lstrip().startswith('{') or '<tool_call>' in k)
items={i.id:i for i in selection_items(6,10,int(sys.argv[3]) if len(sys.argv)>3 else 7,'en')+abstention_items('en')}
out=[]
for r in rows:
    it=items.get(r['item'].split('@')[0]) or items.get(r['item'])
    if it is None:
        it=[v for k,v in items.items() if r['item'].startswith(k)][0]
    ps=probes.get(it.prompt[:60])
    j = round(jm(ps[0]),3) if ps else None
    kind='need' if r['right'] else 'abst'
    out.append((kind, j, bool(r['called']), r['correct'], r['item'], it.prompt[:50]))
for o in sorted(out, key=lambda o:(o[0], o[1] if o[1] is not None else -1)): print(o)
