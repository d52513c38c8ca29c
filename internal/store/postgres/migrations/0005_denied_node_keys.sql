-- Node certificate keys that may no longer speak for any node: NodeService
-- refuses their connections and CertificateService their renewals. Keyed by
-- the SHA-256 of the public key (PKIX), since renewals keep the key.
CREATE TABLE denied_node_keys (
	key_hash  BYTEA  NOT NULL PRIMARY KEY,
	node_id   TEXT   COLLATE "C" NOT NULL, -- the node the key spoke for, for the record
	denied_at BIGINT NOT NULL,
	reason    TEXT   NOT NULL
);
