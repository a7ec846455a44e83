-- docker-compose.yml's MySQL runs this once, as root, when it initialises an empty volume: its
-- entrypoint feeds each .sql in /docker-entrypoint-initdb.d to the client with the database set
-- to MYSQL_DATABASE, after it has made that database and MYSQL_USER (ALL on the database, which
-- the compose's migrate service, demo-setup and the operator's commands run as).
--
-- The gateway serves as gateway_serve instead: SELECT, INSERT, UPDATE and DELETE on that
-- database and nothing else, all that serving needs (no DDL, LOCK TABLES, temporary tables or
-- GET_LOCK outside migrate), as `make run`'s does (scripts/run.sh). Serving as MYSQL_USER, the
-- gateway could drop or alter the schema its credits are kept in; with SUPER or READ_ONLY ADMIN
-- (CONNECTION_ADMIN on MySQL), read_only would not bind it (README, Failovers and maintenance).
-- The password is the demo's, as MYSQL_PASSWORD is; docker-compose.yml's gateway MYSQL_DSN
-- names both (TestComposeServesAsADMLOnlyAccount runs this file and logs in with that DSN).

CREATE USER IF NOT EXISTS 'gateway_serve'@'%' IDENTIFIED BY 'gateway_serve';

-- The database by the session's (the client's --database), so that this file names none; a
-- database name's _ escaped, as the entrypoint escapes MYSQL_DATABASE's, so that the grant is on
-- that database alone rather than on every name the _ wildcard matches. Without a database the
-- statement is NULL and PREPARE fails, and the entrypoint with it.
SET @serve_grant = CONCAT('GRANT SELECT, INSERT, UPDATE, DELETE ON `',
	REPLACE(DATABASE(), '_', '\\_'), '`.* TO ''gateway_serve''@''%''');
PREPARE serve_grant FROM @serve_grant;
EXECUTE serve_grant;
DEALLOCATE PREPARE serve_grant;
