"""Special functions on two units: the special-function unit, or emulated on the FMA pipes.

A transcendental (``exp``, ``rsqrt``, ``sin``, ...) has a hardware instruction on the
special-function unit (NVIDIA's MUFU: 16 results per clock per SM), and it can also be
computed with ordinary FP32 arithmetic on the FMA pipes (range reduction and a short
polynomial, or a Newton step from an integer seed), which FlashAttention-4 does for part of
its exponentials on Blackwell (``flash_attn/cute/utils.py``, ``ex2_emulation``: a
round-down add, two subtractions and a degree-3 Horner polynomial on the FMA pipe, the
exponent put back with a shift and an add on the integer ALU). So charging every special
function to the SFU is not a lower bound: the fastest kernel moves some of them to the FMA
pipes until both units finish together.

``EMULATION`` is the cost of each function on the FMA pipe, in FP32 *issue slots* (one
FADD, FMUL or FFMA per lane; the catalog's ``vector_fp32`` peak counts a slot as 2 FLOP).
Each is the cheapest sequence we know whose result is within bfloat16's unit roundoff
(relative error at most 2**-8: ``tests/test_special.py`` runs each sequence in float32
and checks it); integer and min/max work (seeds, exponent bits, clamps) runs on the
separate integer ALU and is not charged. A float32-accurate emulation costs more, so these
costs never overstate the work: a kernel that emulates more precisely is slower, not faster,
than the bound.

``split`` is the optimal split (a pure function): moving one op off the SFU saves
``1 / sfu_rate`` seconds there and costs ``slots / slot_rate`` on the vector unit, so the
cheapest functions move first, until the two units' times meet (water filling).

>>> moved, t_sfu, t_vec = split({"exp": 1e9}, sfu_rate=1e12, slot_rate=1e13, vector_seconds=0.0)
>>> round(moved["exp"]), round(t_sfu * 1e6, 3), round(t_vec * 1e6, 3)
(666666667, 333.333, 333.333)

Where the SFU is the vector unit itself (AMD CDNA issues transcendentals on the vector ALUs,
at a quarter of the FMA rate), a function is emulated only when that is cheaper outright:

>>> split({"exp": 8.0, "recip": 8.0}, sfu_rate=1.0, slot_rate=4.0, vector_seconds=0.0,
...       same_unit=True)[0]
{'recip': 8.0}
"""

from __future__ import annotations

# function -> (FMA-pipe issue slots per result, how): bf16-faithful (relative error <= 2**-8)
EMULATION: dict[str, tuple[int, str]] = {
    "exp2": (5, "floor by a round-down add of 1.5*2**23, subtract it back, the fraction "
                "(3 slots); 2**f on [0,1) by a degree-2 polynomial (2 FFMA, error 1.7e-3); "
                "the exponent added in the integer ALU"),
    "exp": (5, "exp2 of x*log2(e), the multiply folded into the two range-reduction FFMAs"),
    "recip": (2, "integer seed (0x7EF311C3 - bits, error 5.1%), one Newton step "
                 "y*(2 - x*y) (2 slots, error 2.6e-3)"),
    "rsqrt": (4, "integer seed (0x5F3759DF - bits/2), x/2, one Newton step "
                 "y*(1.5 - x/2*y*y) (3 slots, error 1.8e-3)"),
    "sqrt": (5, "x * rsqrt(x)"),
    "log2": (5, "mantissa m in [sqrt(1/2), sqrt(2)) and exponent e split in the integer ALU; "
                "e to float by a magic add (1), f = m-1 (1), p(f) of degree 2 (2), "
                "f*p(f) + e (1 FFMA)"),
    "log": (5, "log2 with ln(2) folded into the polynomial"),
    "log1p": (6, "log of 1+x (one more add)"),
    "expm1": (6, "exp minus 1 (one more add)"),
    "sigmoid": (8, "1/(1 + exp(-x)): exp (5), an add (1), recip (2)"),
    "tanh": (9, "1 - 2/(1 + exp(2x)): exp (5), an add (1), recip (2), an FFMA (1)"),
    "sin": (7, "quadrant k = round(x*2/pi) (2), r = x - k*pi/2 (1), r*r (1), degree-2 "
               "polynomial in r*r (2), times r (1); the quadrant's sign in the integer ALU"),
    "cos": (7, "as sin, shifted by a quadrant"),
    "pow": (11, "exp2(y * log2(x)): log2 (5), a multiply (1), exp2 (5)"),
}


def split(ops: dict[str, float], sfu_rate: float, slot_rate: float, vector_seconds: float,
          same_unit: bool = False) -> tuple[dict[str, float], float, float]:
    """``(moved, sfu_seconds, added_vector_seconds)``: how many of each function's ``ops``
    go to the FMA pipes so that ``max(SFU time, vector time)`` is least, given the vector
    unit's other work (``vector_seconds``). ``sfu_rate``: SFU results/s; ``slot_rate``: FP32
    FMA-pipe issue slots/s (the ``vector_fp32`` peak over 2). Functions without an
    emulation stay on the SFU.

    >>> split({"exp": 1e9, "erf": 5.0}, 1e12, 1e13, vector_seconds=1.0)[0]   # vector-bound
    {}
    """
    moved: dict[str, float] = {}
    total = sum(ops.values())
    t_s = total / sfu_rate
    added = 0.0
    order = sorted((f for f in ops if f in EMULATION and ops[f] > 0),
                   key=lambda f: (EMULATION[f][0], f))
    if same_unit:
        for f in order:
            if EMULATION[f][0] / slot_rate < 1.0 / sfu_rate:
                moved[f] = ops[f]
                t_s -= ops[f] / sfu_rate
                added += ops[f] * EMULATION[f][0] / slot_rate
        return moved, max(t_s, 0.0), added
    for f in order:
        t_v = vector_seconds + added
        if t_s <= t_v:
            break
        cost = EMULATION[f][0] / slot_rate
        # the balance point: (t_s - x/sfu_rate) == t_v + x*cost
        x = min(ops[f], (t_s - t_v) / (1.0 / sfu_rate + cost))
        moved[f] = x
        t_s -= x / sfu_rate
        added += x * cost
    return moved, max(t_s, 0.0), added


def describe(moved: dict[str, float], ops: dict[str, float]) -> str:
    """One line for the report: what went to the FMA pipes, at what cost.

    >>> describe({"exp": 5e8}, {"exp": 1e9, "rsqrt": 1e6})
    'special functions split between the SFU and the FMA pipes: 50% of exp emulated on the FMA pipes (5 FP32 slots each, bf16-faithful)'
    """
    parts = [f"{moved[f] / ops[f]:.0%} of {f} emulated on the FMA pipes "
             f"({EMULATION[f][0]} FP32 slots each, bf16-faithful)"
             for f in sorted(moved) if ops.get(f)]
    return "special functions split between the SFU and the FMA pipes: " + "; ".join(parts)
