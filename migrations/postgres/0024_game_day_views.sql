-- Game days: when each person first opened the affected service's page in the console
-- during one (its time to detect). One row per game day and person, written once: later
-- views are neither stored nor counted, so a page opened all day costs one row.
CREATE TABLE game_day_views (
    experiment_id  BIGINT NOT NULL REFERENCES experiments (id) ON DELETE CASCADE,
    viewer         TEXT NOT NULL,
    at             BIGINT NOT NULL,
    PRIMARY KEY (experiment_id, viewer)
);
