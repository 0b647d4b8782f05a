"""ember.scheduler"""
