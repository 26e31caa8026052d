-- A function's trial groups (the reference's `trial_instances`): a run by a member of one of
-- them that was also granted `run` on the function (`program_grants.can_run`) is a trial
-- (`ENV_ACCESS_TRIAL=True`). Set with `gantry admin add-trial-group` / `remove-trial-group`.
CREATE TABLE program_trial_groups (
    program_id  TEXT NOT NULL REFERENCES programs (id) ON DELETE CASCADE,
    group_id    TEXT NOT NULL REFERENCES user_groups (id) ON DELETE CASCADE,
    PRIMARY KEY (program_id, group_id)
);

-- Whether the job runs as a trial, decided by `run` (trial groups, or the runtime API's
-- business model) and kept after the job ends, when its stored environment is emptied.
ALTER TABLE jobs ADD COLUMN trial BOOLEAN NOT NULL DEFAULT FALSE;
-- Jobs queued before this column carried the decision in their stored environment only.
UPDATE jobs SET trial = TRUE WHERE env_vars LIKE '%"trial":true%';
