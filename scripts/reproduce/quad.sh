#!/bin/sh
# scripts/reproduce/quad.sh — the six quadratic cases of doc/quad.md
# (Shulgin & Richtárik's analysis of IST with one local step, checked
# exactly on random quadratics by `subtrain quad`): each claim, then what
# `subtrain quad --case N` measures.  Seconds.  -b BIN, and -s "SEEDS" to
# repeat every case with other problems (default seed 1); -o, -k, -c are
# accepted and unused.
. "$(cd "$(dirname "$0")" && pwd)/common.sh"

case_() {   # case_ N: the claim on stdin, then the measurement
    n=$1
    echo "######## Case $n"
    claim
    for s in ${SEEDS:-1}; do
        echo "== Measured: $BIN quad --case $n --seed $s"
        "$BIN" quad --case "$n" --seed "$s" | sed -n '/^Case/,$p'
        echo
    done
}

case_ 1 <<'TEXT'
With preconditioned Perm-1 sketches (d = n, worker i holds the coordinate pi(i) and scales by (L_i)_jj^(-1/2)), b_i = 0 and step 1, one IST step sends any x to 0: the sketched Hessian (1/n) sum C~_i L_i C~_i is exactly I, for every permutation and heterogeneous L_i. Expect |(1/n) sum C~_i L_i C~_i - I| and ||x^1|| / ||x^0|| at rounding (about 1e-16); without the preconditioner no step does it.
TEXT
case_ 2 <<'TEXT'
With b_i != 0 the same method converges, in expectation, to a point x_inf that is not the minimiser x*: E x^k = (1 - gamma)^k x0 + (1 - (1 - gamma)^k) x_inf. Expect the exact recursion to match the formula to rounding, the mean of 10000 runs within the Chebyshev bound of it, and ||x_inf - x*|| far from 0 (the bias of IST).
TEXT
case_ 3 <<'TEXT'
In the homogeneous case b_i = 0 (x* = 0 is a fixed point of every draw), IST with plain Perm-q sketches and step gamma / Lambda converges to x* exactly, for every sequence of draws, as gradient descent does. Expect ||x^K - x*|| at or below 1e-10 relative after the iterations, and the first k reaching it.
TEXT
case_ 4 <<'TEXT'
The sketched direction is not always a descent direction: for L = [[1, 5], [5, 100]], n = 2, plain Perm-1, the direction is g = 2 diag(L) x for both permutations, and <grad f(x), g> = x'(LD + DL)x is negative for some x (LD + DL is indefinite). Expect directions with <grad f, g> < 0, lambda_min(LD + DL) < 0, and f going up along -g; the preconditioned direction is a descent direction.
TEXT
case_ 5 <<'TEXT'
Perm-q sketches are unbiased: E[C_i] = I, and sum_i C_i = n I for every draw. Expect the sum exact (0) for all draws, and the largest deviation of the sampled mean from I under a Bernstein bound at every number of draws, falling like 1/sqrt(S) (dev sqrt(S) flat).
TEXT
case_ 6 <<'TEXT'
IST's theory compares it with compressed communication. Random-k (k = ceil(Q d) coordinates, scaled by d / k) is unbiased, and gradient descent with it converges to x* on case 2's problem, where IST converges to its biased point x_inf. Expect the mean of the compressed vectors within the Bernstein bound of the vector (and, unscaled, 1 - k/d off), the runs with a subset shared by the workers (with and without error feedback) at x* to rounding, and with a subset per worker the mean of the runs within the Chebyshev bound of x*, against ||x_inf - x*|| = 0.38 for IST.
TEXT
