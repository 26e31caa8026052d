-- Usage totals of whole months (issue 47: a period's totals read fast at any history size).
-- `usage_by_day` is written by every ending, so a user's rows of a year lie one to a heap page:
-- at the 10 M scale seed a user's year by function read 7,280 rows on 6,894 pages, a provider's
-- by user 21,304 rows on 18,190 pages. A month's rows are summed here once, after the month
-- ended (`db::usage::sum_months`, from the usage retention's pass and `gantry admin recount`),
-- in one insert ordered by provider and user, and never updated: a provider's rows of a month lie
-- together, a user's in a few places, and every update stays the day table's (HOT, as before).
-- `GET usage/` reads a period's whole months that are summed from here and its other days from
-- `usage_by_day` (grouped by day, from the day rows only). `month` is the month's first day
-- (days since the Unix epoch, UTC).
CREATE TABLE usage_by_month (
    author_id     TEXT NOT NULL,
    month         BIGINT NOT NULL,
    program_id    TEXT NOT NULL,
    function_size TEXT NOT NULL,
    provider_id   TEXT NOT NULL,
    jobs          BIGINT NOT NULL,
    wait_ms       BIGINT NOT NULL,
    run_ms        BIGINT NOT NULL,
    cpu_core_ms   BIGINT NOT NULL,
    gib_ms        BIGINT NOT NULL,
    gpu_ms        BIGINT NOT NULL,
    PRIMARY KEY (author_id, month, program_id, function_size)
);
CREATE INDEX usage_by_month_provider_idx ON usage_by_month (provider_id, month);
CREATE INDEX usage_by_month_program_idx ON usage_by_month (program_id, month);

-- How far the months are summed: every month that starts before `through` (a month's first
-- day; 0: none yet) has its rows in `usage_by_month`. One row.
CREATE TABLE usage_months (
    one     INTEGER PRIMARY KEY CONSTRAINT usage_months_one_check CHECK (one = 1),
    through BIGINT NOT NULL
);
INSERT INTO usage_months (one, through) VALUES (1, 0);
