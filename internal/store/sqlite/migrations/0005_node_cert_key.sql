-- The key of the node certificate issued at a node's latest enrollment:
-- re-enrolling a node ID shuts out the certificate of the machine it
-- replaces. Empty for nodes whose certificates were issued by hand.
ALTER TABLE nodes ADD COLUMN cert_key_hash BLOB NOT NULL DEFAULT x'';
