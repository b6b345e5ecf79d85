"""Small, realistic files in languages the machine may not have source text for.

Used by the synthetic log generator next to the Python stdlib and CPython
headers, so the logs carry a few other languages (and a fallback when the
stdlib is missing). Hand-written in the style of ordinary application code.
"""
from __future__ import annotations

BUNDLED_FILES: dict[str, str] = {
    "web/server/routes/orders.js": '''\
'use strict';

const express = require('express');
const { body, param, validationResult } = require('express-validator');
const db = require('../db');
const log = require('../log').child({ module: 'orders' });

const router = express.Router();

function handleValidation(req, res, next) {
  const errors = validationResult(req);
  if (!errors.isEmpty()) {
    return res.status(400).json({ errors: errors.array() });
  }
  return next();
}

router.get('/', async (req, res, next) => {
  try {
    const limit = Math.min(parseInt(req.query.limit || '50', 10), 200);
    const offset = parseInt(req.query.offset || '0', 10);
    const rows = await db.query(
      'SELECT id, customer_id, status, total_cents, created_at FROM orders ORDER BY created_at DESC LIMIT $1 OFFSET $2',
      [limit, offset],
    );
    res.json({ items: rows, limit, offset });
  } catch (err) {
    next(err);
  }
});

router.get('/:id', param('id').isUUID(), handleValidation, async (req, res, next) => {
  try {
    const order = await db.one('SELECT * FROM orders WHERE id = $1', [req.params.id]);
    if (!order) {
      return res.status(404).json({ error: 'order not found' });
    }
    const items = await db.query('SELECT sku, qty, price_cents FROM order_items WHERE order_id = $1', [order.id]);
    return res.json({ ...order, items });
  } catch (err) {
    return next(err);
  }
});

router.post(
  '/',
  body('customerId').isUUID(),
  body('items').isArray({ min: 1 }),
  body('items.*.sku').isString().trim().notEmpty(),
  body('items.*.qty').isInt({ min: 1, max: 999 }),
  handleValidation,
  async (req, res, next) => {
    const { customerId, items } = req.body;
    try {
      const order = await db.tx(async (t) => {
        const created = await t.one(
          'INSERT INTO orders (customer_id, status) VALUES ($1, $2) RETURNING *',
          [customerId, 'pending'],
        );
        for (const item of items) {
          await t.none(
            'INSERT INTO order_items (order_id, sku, qty) VALUES ($1, $2, $3)',
            [created.id, item.sku, item.qty],
          );
        }
        return created;
      });
      log.info({ orderId: order.id }, 'order created');
      res.status(201).json(order);
    } catch (err) {
      next(err);
    }
  },
);

module.exports = router;
''',
    "web/client/src/components/SearchBox.tsx": '''\
import React, { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { debounce } from "../util/debounce";
import type { SearchResult } from "../api/types";
import { searchProducts } from "../api/search";

interface SearchBoxProps {
  placeholder?: string;
  minChars?: number;
  onSelect: (result: SearchResult) => void;
}

export function SearchBox({ placeholder = "Search", minChars = 2, onSelect }: SearchBoxProps) {
  const [query, setQuery] = useState("");
  const [results, setResults] = useState<SearchResult[]>([]);
  const [loading, setLoading] = useState(false);
  const [highlighted, setHighlighted] = useState(-1);
  const abortRef = useRef<AbortController | null>(null);

  const runSearch = useMemo(
    () =>
      debounce(async (q: string) => {
        abortRef.current?.abort();
        const controller = new AbortController();
        abortRef.current = controller;
        setLoading(true);
        try {
          const found = await searchProducts(q, { signal: controller.signal });
          setResults(found.slice(0, 10));
          setHighlighted(found.length > 0 ? 0 : -1);
        } catch (err) {
          if ((err as Error).name !== "AbortError") {
            console.error("search failed", err);
          }
        } finally {
          setLoading(false);
        }
      }, 200),
    [],
  );

  useEffect(() => {
    if (query.trim().length >= minChars) {
      runSearch(query.trim());
    } else {
      setResults([]);
    }
  }, [query, minChars, runSearch]);

  const onKeyDown = useCallback(
    (e: React.KeyboardEvent<HTMLInputElement>) => {
      if (e.key === "ArrowDown") {
        setHighlighted((h) => Math.min(h + 1, results.length - 1));
      } else if (e.key === "ArrowUp") {
        setHighlighted((h) => Math.max(h - 1, 0));
      } else if (e.key === "Enter" && highlighted >= 0) {
        onSelect(results[highlighted]);
      }
    },
    [results, highlighted, onSelect],
  );

  return (
    <div className="search-box">
      <input
        value={query}
        placeholder={placeholder}
        onChange={(e) => setQuery(e.target.value)}
        onKeyDown={onKeyDown}
        aria-busy={loading}
      />
      <ul role="listbox">
        {results.map((r, i) => (
          <li key={r.id} aria-selected={i === highlighted} onClick={() => onSelect(r)}>
            {r.title}
          </li>
        ))}
      </ul>
    </div>
  );
}
''',
    "services/ingest/handler.go": '''\
package ingest

import (
\t"context"
\t"encoding/json"
\t"errors"
\t"fmt"
\t"net/http"
\t"time"
)

// Event is one telemetry record posted by a client.
type Event struct {
\tID        string            `json:"id"`
\tKind      string            `json:"kind"`
\tTimestamp time.Time         `json:"timestamp"`
\tAttrs     map[string]string `json:"attrs,omitempty"`
}

// Store persists events; implementations must be safe for concurrent use.
type Store interface {
\tPut(ctx context.Context, events []Event) error
}

// Handler accepts batches of events over HTTP.
type Handler struct {
\tStore    Store
\tMaxBatch int
\tTimeout  time.Duration
}

var errEmptyBatch = errors.New("empty batch")

func (h *Handler) decode(r *http.Request) ([]Event, error) {
\tdefer r.Body.Close()
\tvar batch []Event
\tdec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 4<<20))
\tdec.DisallowUnknownFields()
\tif err := dec.Decode(&batch); err != nil {
\t\treturn nil, fmt.Errorf("decode batch: %w", err)
\t}
\tif len(batch) == 0 {
\t\treturn nil, errEmptyBatch
\t}
\tif h.MaxBatch > 0 && len(batch) > h.MaxBatch {
\t\treturn nil, fmt.Errorf("batch of %d events exceeds limit %d", len(batch), h.MaxBatch)
\t}
\treturn batch, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
\tif r.Method != http.MethodPost {
\t\thttp.Error(w, "method not allowed", http.StatusMethodNotAllowed)
\t\treturn
\t}
\tbatch, err := h.decode(r)
\tif err != nil {
\t\thttp.Error(w, err.Error(), http.StatusBadRequest)
\t\treturn
\t}
\tctx, cancel := context.WithTimeout(r.Context(), h.Timeout)
\tdefer cancel()
\tfor i := range batch {
\t\tif batch[i].Timestamp.IsZero() {
\t\t\tbatch[i].Timestamp = time.Now().UTC()
\t\t}
\t}
\tif err := h.Store.Put(ctx, batch); err != nil {
\t\thttp.Error(w, "store unavailable", http.StatusServiceUnavailable)
\t\treturn
\t}
\tw.WriteHeader(http.StatusAccepted)
\t_ = json.NewEncoder(w).Encode(map[string]int{"accepted": len(batch)})
}
''',
    "crates/tokenizer/src/lexer.rs": '''\
use std::iter::Peekable;
use std::str::CharIndices;

#[derive(Debug, Clone, PartialEq)]
pub enum Token<'a> {
    Ident(&'a str),
    Number(f64),
    Str(String),
    Punct(char),
    Arrow,
}

#[derive(Debug)]
pub struct LexError {
    pub offset: usize,
    pub message: String,
}

pub struct Lexer<'a> {
    src: &'a str,
    chars: Peekable<CharIndices<'a>>,
}

impl<'a> Lexer<'a> {
    pub fn new(src: &'a str) -> Self {
        Lexer { src, chars: src.char_indices().peekable() }
    }

    fn skip_whitespace(&mut self) {
        while let Some(&(_, c)) = self.chars.peek() {
            if c.is_whitespace() {
                self.chars.next();
            } else {
                break;
            }
        }
    }

    fn ident(&mut self, start: usize) -> Token<'a> {
        let mut end = start;
        while let Some(&(i, c)) = self.chars.peek() {
            if c.is_alphanumeric() || c == '_' {
                end = i + c.len_utf8();
                self.chars.next();
            } else {
                break;
            }
        }
        Token::Ident(&self.src[start..end])
    }

    fn string(&mut self, start: usize) -> Result<Token<'a>, LexError> {
        let mut out = String::new();
        while let Some((_, c)) = self.chars.next() {
            match c {
                '"' => return Ok(Token::Str(out)),
                '\\\\' => match self.chars.next() {
                    Some((_, 'n')) => out.push('\\n'),
                    Some((_, other)) => out.push(other),
                    None => break,
                },
                _ => out.push(c),
            }
        }
        Err(LexError { offset: start, message: "unterminated string".into() })
    }

    pub fn next_token(&mut self) -> Option<Result<Token<'a>, LexError>> {
        self.skip_whitespace();
        let (i, c) = self.chars.next()?;
        Some(match c {
            c if c.is_alphabetic() || c == '_' => Ok(self.ident(i)),
            '"' => self.string(i),
            '-' if matches!(self.chars.peek(), Some(&(_, '>'))) => {
                self.chars.next();
                Ok(Token::Arrow)
            }
            c if c.is_ascii_digit() => {
                let mut end = i + 1;
                while let Some(&(j, d)) = self.chars.peek() {
                    if d.is_ascii_digit() || d == '.' {
                        end = j + 1;
                        self.chars.next();
                    } else {
                        break;
                    }
                }
                self.src[i..end]
                    .parse()
                    .map(Token::Number)
                    .map_err(|_| LexError { offset: i, message: "bad number".into() })
            }
            other => Ok(Token::Punct(other)),
        })
    }
}
''',
    "deploy/scripts/rollout.sh": '''\
#!/usr/bin/env bash
# Roll a new image out to one environment, waiting for health checks.
set -euo pipefail

usage() {
  echo "usage: $0 <env> <image-tag> [--dry-run]" >&2
  exit 2
}

[[ $# -ge 2 ]] || usage
ENV="$1"
TAG="$2"
DRY_RUN="${3:-}"
NAMESPACE="app-${ENV}"
DEPLOYMENTS=(api worker scheduler)
TIMEOUT="${ROLLOUT_TIMEOUT:-300s}"

log() { printf '%s [%s] %s\\n' "$(date -u +%H:%M:%S)" "$ENV" "$*"; }

run() {
  if [[ "$DRY_RUN" == "--dry-run" ]]; then
    log "dry-run: $*"
  else
    "$@"
  fi
}

case "$ENV" in
  staging|production) ;;
  *) echo "unknown environment: $ENV" >&2; exit 2 ;;
esac

if [[ "$ENV" == "production" && -z "${CONFIRM:-}" ]]; then
  read -r -p "Deploy ${TAG} to production? [y/N] " answer
  [[ "$answer" == "y" ]] || { log "aborted"; exit 1; }
fi

for d in "${DEPLOYMENTS[@]}"; do
  log "updating ${d} to ${TAG}"
  run kubectl -n "$NAMESPACE" set image "deployment/${d}" "${d}=registry.internal/${d}:${TAG}"
done

for d in "${DEPLOYMENTS[@]}"; do
  log "waiting for ${d}"
  if ! run kubectl -n "$NAMESPACE" rollout status "deployment/${d}" --timeout="$TIMEOUT"; then
    log "rollout of ${d} failed, rolling back"
    run kubectl -n "$NAMESPACE" rollout undo "deployment/${d}"
    exit 1
  fi
done

log "all deployments healthy"
''',
    "db/migrations/0042_invoices.sql": '''\
-- Invoices and their line items; replaces the old billing_documents table.
BEGIN;

CREATE TABLE invoices (
    id              UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    customer_id     UUID NOT NULL REFERENCES customers (id),
    number          TEXT NOT NULL UNIQUE,
    status          TEXT NOT NULL DEFAULT 'draft'
                    CHECK (status IN ('draft', 'issued', 'paid', 'void')),
    currency        CHAR(3) NOT NULL DEFAULT 'USD',
    issued_at       TIMESTAMPTZ,
    due_at          TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE invoice_lines (
    invoice_id      UUID NOT NULL REFERENCES invoices (id) ON DELETE CASCADE,
    position        INTEGER NOT NULL,
    description     TEXT NOT NULL,
    quantity        NUMERIC(12, 3) NOT NULL CHECK (quantity > 0),
    unit_price      NUMERIC(12, 2) NOT NULL,
    tax_rate        NUMERIC(5, 4) NOT NULL DEFAULT 0,
    PRIMARY KEY (invoice_id, position)
);

CREATE INDEX invoices_customer_idx ON invoices (customer_id, created_at DESC);
CREATE INDEX invoices_open_idx ON invoices (due_at) WHERE status = 'issued';

INSERT INTO invoices (id, customer_id, number, status, currency, issued_at, created_at)
SELECT id, customer_id, doc_number, CASE WHEN paid THEN 'paid' ELSE 'issued' END,
       currency, issued_on, created_on
FROM billing_documents
WHERE kind = 'invoice';

CREATE OR REPLACE FUNCTION invoices_touch() RETURNS trigger AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER invoices_touch BEFORE UPDATE ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoices_touch();

COMMIT;
''',
    "android/app/src/main/java/com/example/sync/SyncWorker.java": '''\
package com.example.sync;

import android.content.Context;
import android.util.Log;

import androidx.annotation.NonNull;
import androidx.work.Data;
import androidx.work.Worker;
import androidx.work.WorkerParameters;

import java.io.IOException;
import java.util.List;

public class SyncWorker extends Worker {
    private static final String TAG = "SyncWorker";
    public static final String KEY_ACCOUNT = "account";
    private static final int MAX_ATTEMPTS = 5;

    private final SyncRepository repository;

    public SyncWorker(@NonNull Context context, @NonNull WorkerParameters params) {
        super(context, params);
        this.repository = SyncRepository.get(context);
    }

    @NonNull
    @Override
    public Result doWork() {
        String account = getInputData().getString(KEY_ACCOUNT);
        if (account == null || account.isEmpty()) {
            Log.w(TAG, "no account given, nothing to sync");
            return Result.failure();
        }
        try {
            List<Change> pending = repository.pendingChanges(account);
            int pushed = 0;
            for (Change change : pending) {
                if (isStopped()) {
                    return Result.retry();
                }
                repository.push(account, change);
                pushed++;
            }
            long cursor = repository.pull(account);
            Data output = new Data.Builder()
                    .putInt("pushed", pushed)
                    .putLong("cursor", cursor)
                    .build();
            return Result.success(output);
        } catch (IOException e) {
            Log.w(TAG, "sync failed, attempt " + getRunAttemptCount(), e);
            if (getRunAttemptCount() + 1 >= MAX_ATTEMPTS) {
                return Result.failure();
            }
            return Result.retry();
        }
    }
}
''',
    ".github/workflows/ci.yaml": '''\
name: ci

on:
  push:
    branches: [main]
  pull_request:

concurrency:
  group: ci-${{ github.ref }}
  cancel-in-progress: true

jobs:
  test:
    runs-on: ubuntu-latest
    strategy:
      fail-fast: false
      matrix:
        python: ["3.10", "3.11", "3.12"]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: ${{ matrix.python }}
          cache: pip
      - name: Install
        run: |
          python -m pip install --upgrade pip
          pip install -e ".[test]"
      - name: Lint
        run: ruff check . && ruff format --check .
      - name: Test
        run: pytest -q --maxfail=5 --junitxml=reports/junit.xml
      - uses: actions/upload-artifact@v4
        if: always()
        with:
          name: junit-${{ matrix.python }}
          path: reports/junit.xml

  build:
    needs: test
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - name: Build image
        run: docker build -t app:${{ github.sha }} .
      - name: Smoke test
        run: docker run --rm app:${{ github.sha }} --version
''',
}
