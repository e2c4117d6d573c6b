"""nanobind vs pybind11: per-call time of a trivial bound method and of a Tensor add (see CMakeLists.txt)."""
import sys, timeit
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
import cmp_nb, cmp_pb
for name, m in (("nanobind", cmp_nb), ("pybind11", cmp_pb)):
    o = m.Obj(); a = m.randn([4, 4]); b = m.randn([4, 4])
    n = 200000
    t1 = min(timeit.repeat(o.f, number=n, repeat=5)) / n * 1e9
    n2 = 50000
    t2 = min(timeit.repeat(lambda: a + b, number=n2, repeat=5)) / n2 * 1e9
    print(f"{name}: trivial method {t1:.0f} ns/call, Tensor add {t2:.0f} ns/call")
