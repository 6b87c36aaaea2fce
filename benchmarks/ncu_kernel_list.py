import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
H = rows[h]; k, u, v = H.index("Kernel Name"), H.index("Metric Unit"), H.index("Metric Value")
tot = 0
for r in rows[h + 1:]:
    if len(r) > v:
        print(f"{r[k][:70]:<70} {r[v]:>10} {r[u]}"); tot += float(r[v].replace(",", ""))
print("sum", tot)
