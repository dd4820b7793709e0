"""numba: the forward push of kernels/push.py for a block of questions, compiled on first use and cached on disk
(numba's ``cache=True``: the package's __pycache__, or NUMBA_CACHE_DIR).

This module imports ``numba`` at import time, so kernels/push.py imports it only after ``backends.use_numba``
said yes. ``push_block`` has the contract of push.py's torch fallback for questions [q0, q1) (the same pushes in
the same rounds, float32 as there); tests/kernels/test_push.py compares the two.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, inline="always")
def grown(a, n):
    """``a`` with room for index n (doubled when full)."""
    if n < a.shape[0]:
        return a
    b = np.empty(2 * a.shape[0], a.dtype)
    b[:n] = a[:n]
    return b


@numba.njit(cache=True, nogil=True, inline="always")
def before(s1, v1, s2, v2):
    """Whether passage v1 of estimate s1 ranks before v2 of s2: higher, equal ones by lower index."""
    return s1 > s2 or (s1 == s2 and v1 < v2)


@numba.njit(cache=True, nogil=True)
def push_block(crow, col, val, strength, qptr, qnode, qres, q0, q1, P, d, eps, max_rounds, rm, p,
               out_idx, out_val, out_stats):
    """The pushes of questions [q0, q1) (kernels/push.py's forward_push: the CSR walk crow / col / val, strength;
    question q's reset at qnode[qptr[q]:qptr[q + 1]] with residuals qres; P passages; d, eps, max_rounds):
    writes out_idx / out_val [B, k] (rows q0..q1 - 1; given -1 / 0) and out_stats [B, 4] (rounds, touched,
    touched passages, pushed)."""
    k = out_idx.shape[1]
    d32, keep32, eps32 = np.float32(d), np.float32(1.0 - d), np.float32(eps)  # float32 as the torch path
    # rm [N, 2]: per node, side by side (one cache line per visit), the residual and the last round that added
    # to it (-1: untouched; 0: the reset); p [P]: the passages' estimates. Given zeroed (rm's marks -1), left
    # so: each question resets the nodes it touched
    touched = np.empty(1024, np.int64)
    front = np.empty(1024, np.int64)
    nxt = np.empty(1024, np.int64)
    ar = np.empty(1024, np.float32)
    for q in range(q0, q1):
        nt = 0
        for j in range(qptr[q], qptr[q + 1]):
            u = qnode[j]
            rm[u, 0] += qres[j]
            if rm[u, 1] < 0:
                rm[u, 1] = 0.0
                touched = grown(touched, nt)
                touched[nt] = u
                nt += 1
        nf = 0
        for i in range(nt):
            u = touched[i]
            if rm[u, 0] > eps32 * strength[u]:
                front = grown(front, nf)
                front[nf] = u
                nf += 1
        rounds = 0
        pushed = 0
        while nf > 0 and rounds < max_rounds:
            rounds += 1
            fr = np.float32(rounds)
            if ar.shape[0] < nf:
                ar = np.empty(2 * nf, np.float32)
            for i in range(nf):  # take the round's residuals first: a pushed node may receive again
                u = front[i]
                a = rm[u, 0]
                rm[u, 0] = 0.0
                ar[i] = a
                if u < P:
                    p[u] += a * keep32
            nn = 0
            for i in range(nf):
                u = front[i]
                a = ar[i]
                lo, hi = crow[u], crow[u + 1]
                pushed += hi - lo
                for e in range(lo, hi):
                    v = col[e]
                    rm[v, 0] += a * val[e] * d32
                    m = rm[v, 1]
                    if m != fr:
                        if m < 0:
                            touched = grown(touched, nt)
                            touched[nt] = v
                            nt += 1
                        rm[v, 1] = fr
                        nxt = grown(nxt, nn)
                        nxt[nn] = v
                        nn += 1
            if front.shape[0] < nn:
                front = np.empty(max(nn, 2 * front.shape[0]), np.int64)
            nf = 0
            for i in range(nn):
                v = nxt[i]
                if rm[v, 0] > eps32 * strength[v]:
                    front[nf] = v
                    nf += 1
        # the top k of the touched passages (by descending estimate, equal ones by lower index), kept in
        # order by insertion: most passages fail the comparison with the k-th
        m = 0
        npas = 0
        for i in range(nt):
            v = touched[i]
            if v >= P:
                continue
            npas += 1
            s = p[v]
            if m == k and not before(s, v, out_val[q, k - 1], out_idx[q, k - 1]):
                continue
            j = min(m, k - 1)
            while j > 0 and before(s, v, out_val[q, j - 1], out_idx[q, j - 1]):
                out_val[q, j] = out_val[q, j - 1]
                out_idx[q, j] = out_idx[q, j - 1]
                j -= 1
            out_val[q, j] = s
            out_idx[q, j] = v
            m = min(m + 1, k)
        out_stats[q, 0] = rounds
        out_stats[q, 1] = nt
        out_stats[q, 2] = npas
        out_stats[q, 3] = pushed
        for i in range(nt):  # back to zero for the next question: work in the touched nodes only
            u = touched[i]
            rm[u, 0] = 0.0
            rm[u, 1] = -1.0
            if u < P:
                p[u] = 0.0
