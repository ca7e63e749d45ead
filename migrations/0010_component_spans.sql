-- Issue 28: durable progress inside a component written span by span
-- (`convert/src/placed.rs`). A row claims that every span source `file`
-- feeds into component `component` is written in that component's temp
-- file (`<component>.ftpipe-tmp`), and that the temp file was fsynced
-- after they were: it is inserted only after that fsync. `identity` is the
-- component identity the temp file is written for; a temp file is resumed
-- only under the same identity, otherwise it is recreated and its rows
-- deleted first. The rows of a component are deleted in the transaction
-- that writes its receipt (the temp file is gone then: renamed).
-- Number 0009 is reserved for issue 26.

CREATE TABLE component_spans (
    component TEXT    NOT NULL,
    identity  TEXT    NOT NULL CHECK (length(identity) = 64),
    file      TEXT    NOT NULL,
    bytes     INTEGER NOT NULL CHECK (bytes >= 0),
    run_id    INTEGER NOT NULL REFERENCES runs(id),
    at        TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (component, file)
);
