"""BM25 product search, a short numpy re-implementation of the Lucene/Anserini setup.

Maps to docs/webshop.md §3:
  * one document per product: lower(Title + " " + Description + " " + BulletPoints[0] + " " +
    option_text), option_text like "color: black, navy blue, and size: medium, large";
  * analysis as Lucene's English analyzer: word tokens, possessive "'s" removed, Lucene's 33
    English stop words removed, Porter stemming (PyStemmer's "porter" algorithm);
  * Lucene BM25 with Anserini's defaults k1 = 0.9, b = 0.4:
        score(d, q) = sum_t qtf_t * idf_t * tf / (tf + k1 * (1 - b + b * dl / avgdl)),
        idf_t = ln(1 + (N - df + 0.5) / (df + 0.5)),
    ties broken by catalogue order (Lucene's doc id order); only documents matching at least one
    query term are returned; top 50 (SEARCH_RETURN_N).

Deviations: the tokenizer is a regex approximation of Lucene's StandardTokenizer and document
lengths are exact (Lucene stores them lossily in one byte), so rankings can differ slightly from
pyserini's. The index is built once per process and is read-only (safe to share across threads).
"""
from __future__ import annotations

import re
from collections import Counter

import numpy as np
import Stemmer

SEARCH_RETURN_N = 50
LUCENE_STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)
_TOKEN = re.compile(r"[^\W_]+(?:['’.][^\W_]+)*")
_STEMMER = Stemmer.Stemmer("porter")


def analyze(text: str) -> list[str]:
    """Lower-case, tokenize, drop possessives and stop words, Porter-stem."""
    tokens = []
    for token in _TOKEN.findall(text.lower()):
        if token.endswith(("'s", "’s")):
            token = token[:-2]
        if token and token not in LUCENE_STOP_WORDS:
            tokens.append(token)
    return _STEMMER.stemWords(tokens)


def option_text(options: dict[str, list[str]]) -> str:
    return ", and ".join(f"{name}: {', '.join(values)}" for name, values in options.items())


def document_text(product: dict) -> str:
    bullets = product.get("BulletPoints") or []
    parts = [product.get("Title", ""), product.get("Description", ""), bullets[0] if bullets else "",
             option_text(product.get("options", {}))]
    return " ".join(parts).lower()


class BM25Index:
    """In-memory BM25 over product documents; `search(query)` -> list of ASINs, best first."""

    def __init__(self, products: list[dict], k1: float = 0.9, b: float = 0.4):
        self.asins = [product["asin"] for product in products]
        self.k1, self.b = k1, b
        docs = [Counter(analyze(document_text(product))) for product in products]
        lengths = np.array([sum(doc.values()) for doc in docs], dtype=np.float64)
        n_docs = len(docs)
        avgdl = float(lengths.mean()) if n_docs and lengths.mean() > 0 else 1.0
        norm = k1 * (1.0 - b + b * lengths / avgdl)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for index, doc in enumerate(docs):
            for term, tf in doc.items():
                ids, tfs = postings.setdefault(term, ([], []))
                ids.append(index)
                tfs.append(tf)
        # term -> (doc ids, per-document contribution idf * tf / (tf + norm)), both numpy arrays
        self.postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for term, (ids, tfs) in postings.items():
            ids_arr = np.array(ids, dtype=np.int64)
            tf_arr = np.array(tfs, dtype=np.float64)
            df = len(ids)
            idf = np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
            self.postings[term] = (ids_arr, idf * tf_arr / (tf_arr + norm[ids_arr]))
        self.num_docs = n_docs

    def scores(self, query: str) -> np.ndarray:
        scores = np.zeros(self.num_docs, dtype=np.float64)
        for term, count in Counter(analyze(query)).items():
            posting = self.postings.get(term)
            if posting is not None:
                ids, contribution = posting
                scores[ids] += count * contribution
        return scores

    def search(self, query: str, top_n: int = SEARCH_RETURN_N) -> list[str]:
        scores = self.scores(query)
        matched = np.flatnonzero(scores > 0)
        if matched.size == 0:
            return []
        # best first; equal scores keep catalogue order (stable sort on the negated score)
        order = matched[np.argsort(-scores[matched], kind="stable")][:top_n]
        return [self.asins[i] for i in order]
